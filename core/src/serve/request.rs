//! What the engine reads of a request: a view, so a trace held by the driver is not copied.

use crate::fingerprint::GridThw;

/// A request as the engine sees it. Implemented by `moonagent_traces::schema::Request`.
pub trait RequestView {
    /// Trace request id.
    fn id(&self) -> u64;
    /// Session id.
    fn session(&self) -> u64;
    /// Tenant (selects the model context and so the fingerprints).
    fn tenant(&self) -> u32;
    /// Prompt tokens, text plus visual.
    fn prompt_tokens(&self) -> u32;
    /// Tokens decoded before the fork (or in all, without one).
    fn output_tokens(&self) -> u32;
    /// Prefix-block ids of the prompt (empty when unknown).
    fn prompt_blocks(&self) -> &[u64];
    /// Images the request needs.
    fn image_count(&self) -> usize;
    /// Image `i`: `(content id, visual tokens, patch grid if known)`.
    fn image(&self, i: usize) -> (u64, u32, Option<[u32; 3]>);
    /// Output tokens of each agent branch (empty when the request does not fork).
    fn branch_output_tokens(&self) -> &[u32];
}

/// One image as the engine carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Img {
    /// Content id (equal ids: the same processed image).
    pub content: u64,
    /// Visual tokens (at least 1).
    pub tokens: u32,
    /// Patch grid.
    pub grid: GridThw,
}

/// The images of `r` (at least one visual token each; a grid of `1 x 2 x 2n` patches
/// when the trace gives none).
pub fn images_of<R: RequestView + ?Sized>(r: &R) -> Vec<Img> {
    image_iter(r).collect()
}

/// [`images_of`] as an iterator (for a list of something that holds each image).
pub(crate) fn image_iter<R: RequestView + ?Sized>(r: &R) -> impl Iterator<Item = Img> + '_ {
    (0..r.image_count()).map(|i| {
        let (content, visual_tokens, grid) = r.image(i);
        let tokens = visual_tokens.max(1);
        Img {
            content,
            tokens,
            grid: grid.map_or(GridThw::new(1, 2, 2 * u64::from(tokens)), |g| {
                GridThw::new(u64::from(g[0]), u64::from(g[1]), u64::from(g[2]))
            }),
        }
    })
}
