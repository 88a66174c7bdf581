//! The trace schema: one header and a stream of requests.
//!
//! A request carries its arrival time in integer nanoseconds, its session, turn and
//! tenant, its prompt as a token count and (optionally) as prefix-block ids in the style of
//! Mooncake's `hash_ids` (equal ids at equal positions are a shared prefix), the images
//! whose encoder outputs the request needs, its output length, and an optional fork into
//! parallel agent branches. [`Validator`] holds the rules every reader and writer checks
//! as it streams; `traces/README.md` documents the fields and their meaning.

use serde::{Deserialize, Serialize};

use crate::error::FieldError;

/// The schema version this crate reads and writes.
pub const SCHEMA_VERSION: u32 = 1;

/// Qwen2.5-VL ViT patch size in pixels.
pub const QWEN_PATCH_SIZE: u32 = 14;
/// Qwen2.5-VL spatial merge (2x2 patches become one visual token).
pub const QWEN_SPATIAL_MERGE: u32 = 2;
/// Qwen2.5-VL image processor default `min_pixels`.
pub const QWEN_MIN_PIXELS: u64 = 56 * 56;
/// Qwen2.5-VL image processor default `max_pixels`.
pub const QWEN_MAX_PIXELS: u64 = 28 * 28 * 16384;

fn default_patch_size() -> u32 {
    QWEN_PATCH_SIZE
}
fn default_spatial_merge() -> u32 {
    QWEN_SPATIAL_MERGE
}

/// The first record of every trace file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceHeader {
    /// Schema version; readers accept only [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Tokens per prefix block (`prompt_blocks`); 512 for Mooncake's `hash_ids`.
    pub block_size_tokens: u32,
    /// ViT patch size used to interpret `grid_thw` (default 14).
    #[serde(default = "default_patch_size")]
    pub patch_size: u32,
    /// Spatial merge used to interpret `grid_thw` (default 2: 2x2 patches per token).
    #[serde(default = "default_spatial_merge")]
    pub spatial_merge: u32,
    /// What produced the trace (`w3`, `sessions`, `import-mooncake`, ...).
    pub generator: String,
    /// The generator seed, when the trace is generated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Where the records come from, when imported (file name and origin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The full generator or importer configuration, so the trace can be regenerated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<serde_json::Value>,
    /// Free text: what was added or assumed (e.g. "images attached by generator w3, seed 7").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
}

impl TraceHeader {
    /// A header for the current schema with Qwen2.5-VL vision defaults.
    pub fn new(generator: impl Into<String>, block_size_tokens: u32) -> Self {
        Self {
            schema_version: SCHEMA_VERSION,
            block_size_tokens,
            patch_size: QWEN_PATCH_SIZE,
            spatial_merge: QWEN_SPATIAL_MERGE,
            generator: generator.into(),
            seed: None,
            source: None,
            config: None,
            notes: None,
        }
    }

    /// Check the header's own rules (version, non-zero sizes).
    pub fn check(&self) -> Result<(), FieldError> {
        if self.schema_version != SCHEMA_VERSION {
            return Err(FieldError::new(
                "header.schema_version",
                format!(
                    "unknown schema version {}, expected {SCHEMA_VERSION}",
                    self.schema_version
                ),
            ));
        }
        if self.block_size_tokens == 0 {
            return Err(FieldError::new(
                "header.block_size_tokens",
                "expected a block size of at least 1 token, found 0",
            ));
        }
        if self.patch_size == 0 {
            return Err(FieldError::new(
                "header.patch_size",
                "expected at least 1 pixel, found 0",
            ));
        }
        if self.spatial_merge == 0 {
            return Err(FieldError::new(
                "header.spatial_merge",
                "expected at least 1, found 0",
            ));
        }
        Ok(())
    }
}

/// One image a request feeds to the encoder path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "ImageRepr")]
pub struct Image {
    /// Content id: equal ids are the same processed image (the embedding-cache key).
    pub content_id: u64,
    /// Original width in pixels, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<u32>,
    /// Original height in pixels, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub height: Option<u32>,
    /// Visual tokens the image contributes to the prompt (after spatial merge).
    pub visual_tokens: u32,
    /// Patch grid `(t, h, w)` before the merge, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grid_thw: Option<[u32; 3]>,
}

/// The on-disk form of an image: `visual_tokens` may be left out when a grid or the pixel
/// size is given, and is then derived (from the grid, else by Qwen2.5-VL's resize).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ImageRepr {
    content_id: u64,
    #[serde(default)]
    width: Option<u32>,
    #[serde(default)]
    height: Option<u32>,
    #[serde(default)]
    visual_tokens: Option<u32>,
    #[serde(default)]
    grid_thw: Option<[u32; 3]>,
}

/// Why an image record has no visual token count (serde reports it with the line).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// No `visual_tokens` and a `grid_thw` that is not a valid grid.
    #[error("field `visual_tokens` missing and `grid_thw` is not a valid grid")]
    BadGrid,
    /// No `visual_tokens` or grid, and a size the resize rule refuses.
    #[error("field `visual_tokens` missing and {width}x{height} pixels cannot be resized")]
    Unresizable {
        /// Width in pixels.
        width: u32,
        /// Height in pixels.
        height: u32,
    },
    /// None of `visual_tokens`, `grid_thw`, or width and height.
    #[error(
        "missing field `visual_tokens` (expected visual_tokens, grid_thw, or width and height)"
    )]
    NoTokens,
}

impl TryFrom<ImageRepr> for Image {
    type Error = ImageError;
    fn try_from(r: ImageRepr) -> Result<Self, ImageError> {
        let visual_tokens = match (r.visual_tokens, r.grid_thw, r.width, r.height) {
            (Some(v), _, _, _) => v,
            (None, Some(g), _, _) => {
                visual_tokens_for_grid(g, QWEN_SPATIAL_MERGE).ok_or(ImageError::BadGrid)?
            }
            (None, None, Some(w), Some(h)) => {
                qwen25vl_visual_tokens(w, h).ok_or(ImageError::Unresizable {
                    width: w,
                    height: h,
                })?
            }
            _ => return Err(ImageError::NoTokens),
        };
        Ok(Image {
            content_id: r.content_id,
            width: r.width,
            height: r.height,
            visual_tokens,
            grid_thw: r.grid_thw,
        })
    }
}

impl Image {
    /// An image of `width` x `height` pixels with Qwen2.5-VL's grid and token count.
    /// `None` if the size cannot be processed (zero side, aspect ratio over 200).
    pub fn qwen25vl(content_id: u64, width: u32, height: u32) -> Option<Self> {
        let grid = qwen25vl_grid(width, height)?;
        Some(Image {
            content_id,
            width: Some(width),
            height: Some(height),
            visual_tokens: visual_tokens_for_grid(grid, QWEN_SPATIAL_MERGE)?,
            grid_thw: Some(grid),
        })
    }

    /// An image known only by its visual-token count.
    pub fn tokens_only(content_id: u64, visual_tokens: u32) -> Self {
        Image {
            content_id,
            width: None,
            height: None,
            visual_tokens,
            grid_thw: None,
        }
    }
}

/// A fork of the request into parallel agent branches after its prompt (and its
/// `output_tokens` of shared decode) : branch `i` decodes `output_tokens[i]` tokens.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fork {
    /// Number of branches (at least 1).
    pub branches: u32,
    /// Output tokens of each branch; its length equals `branches`.
    pub output_tokens: Vec<u32>,
}

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// Request id (unique within a trace by convention; generators number from 0).
    pub id: u64,
    /// Arrival time in nanoseconds since the trace start; non-decreasing along the file.
    pub arrival_ns: u64,
    /// Session (conversation) the request belongs to.
    #[serde(default)]
    pub session: u64,
    /// Turn within the session, from 0.
    #[serde(default)]
    pub turn: u32,
    /// Tenant.
    #[serde(default)]
    pub tenant: u32,
    /// Prompt length in LLM tokens, text plus the visual tokens of `images`.
    pub prompt_tokens: u32,
    /// Prefix-block ids covering the prompt, `ceil(prompt_tokens / block_size)` of them,
    /// or empty when unknown.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prompt_blocks: Vec<u64>,
    /// Images whose encoder outputs this request needs (new in this prompt; images of
    /// earlier turns already covered by shared prefix blocks are not listed again).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<Image>,
    /// Tokens decoded (before the fork, if any).
    pub output_tokens: u32,
    /// Parallel agent branches after the shared part, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork: Option<Fork>,
}

impl Request {
    /// Total visual tokens of the request's images.
    pub fn visual_tokens(&self) -> u64 {
        self.images.iter().map(|i| u64::from(i.visual_tokens)).sum()
    }

    /// Total decoded tokens: the shared part plus every branch.
    pub fn total_output_tokens(&self) -> u64 {
        let branches: u64 = self
            .fork
            .as_ref()
            .map(|f| f.output_tokens.iter().map(|&t| u64::from(t)).sum())
            .unwrap_or(0);
        u64::from(self.output_tokens) + branches
    }
}

/// `ceil(tokens / block_size)`: the number of prefix blocks covering `tokens`.
pub fn blocks_for_tokens(tokens: u32, block_size: u32) -> u64 {
    if block_size == 0 {
        return 0;
    }
    u64::from(tokens).div_ceil(u64::from(block_size))
}

/// Tokens in block `index` of a prompt of `prompt_tokens` tokens (the last may be partial).
pub fn tokens_in_block(prompt_tokens: u32, block_size: u32, index: u64) -> u64 {
    let start = index * u64::from(block_size);
    u64::from(prompt_tokens)
        .saturating_sub(start)
        .min(u64::from(block_size))
}

/// Visual tokens of a patch grid after a `merge` x `merge` spatial merge; `None` unless
/// every side is positive and the spatial sides divide by `merge`.
pub fn visual_tokens_for_grid(grid: [u32; 3], merge: u32) -> Option<u32> {
    let [t, h, w] = grid;
    if t == 0 || h == 0 || w == 0 || merge == 0 || h % merge != 0 || w % merge != 0 {
        return None;
    }
    let tokens = u64::from(t) * u64::from(h / merge) * u64::from(w / merge);
    u32::try_from(tokens).ok()
}

/// Qwen2.5-VL's `smart_resize`: the processed `(height, width)` in pixels, multiples of
/// `factor` (= patch x merge = 28), with the pixel count inside `[min_pixels, max_pixels]`
/// and the aspect ratio kept. `None` for a zero side or an aspect ratio over 200.
pub fn smart_resize(
    height: u32,
    width: u32,
    factor: u32,
    min_pixels: u64,
    max_pixels: u64,
) -> Option<(u32, u32)> {
    if height == 0 || width == 0 || factor == 0 {
        return None;
    }
    let (h, w, f) = (f64::from(height), f64::from(width), f64::from(factor));
    if h.max(w) / h.min(w) > 200.0 {
        return None;
    }
    // Python's round() rounds half to even: keep it so grids match the real processor.
    let mut h_bar = f.max((h / f).round_ties_even() * f);
    let mut w_bar = f.max((w / f).round_ties_even() * f);
    if h_bar * w_bar > max_pixels as f64 {
        let beta = ((h * w) / max_pixels as f64).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    } else if h_bar * w_bar < min_pixels as f64 {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    let too_big = |x: f64| x > f64::from(u32::MAX);
    if !(h_bar.is_finite() && w_bar.is_finite()) || too_big(h_bar) || too_big(w_bar) {
        return None;
    }
    Some((h_bar as u32, w_bar as u32))
}

/// Qwen2.5-VL's patch grid `(1, H/14, W/14)` for an image of `width` x `height` pixels
/// after `smart_resize` with the processor's default pixel limits.
pub fn qwen25vl_grid(width: u32, height: u32) -> Option<[u32; 3]> {
    let factor = QWEN_PATCH_SIZE * QWEN_SPATIAL_MERGE;
    let (h, w) = smart_resize(height, width, factor, QWEN_MIN_PIXELS, QWEN_MAX_PIXELS)?;
    Some([1, h / QWEN_PATCH_SIZE, w / QWEN_PATCH_SIZE])
}

/// Qwen2.5-VL visual tokens for an image: `(H/14)(W/14)/4` after `smart_resize`.
pub fn qwen25vl_visual_tokens(width: u32, height: u32) -> Option<u32> {
    visual_tokens_for_grid(qwen25vl_grid(width, height)?, QWEN_SPATIAL_MERGE)
}

/// The streaming checks every reader and writer applies, in file order.
///
/// Constant memory: it remembers only the previous arrival time.
#[derive(Debug, Clone)]
pub struct Validator {
    block_size: u32,
    spatial_merge: u32,
    last_arrival_ns: Option<u64>,
}

impl Validator {
    /// A validator for requests under `header`.
    pub fn new(header: &TraceHeader) -> Self {
        Self {
            block_size: header.block_size_tokens,
            spatial_merge: header.spatial_merge,
            last_arrival_ns: None,
        }
    }

    /// Check one request (and remember its arrival for the next).
    pub fn check(&mut self, r: &Request) -> Result<(), FieldError> {
        if let Some(prev) = self.last_arrival_ns {
            if r.arrival_ns < prev {
                return Err(FieldError::new(
                    "arrival_ns",
                    format!(
                        "timestamps out of order: {} is before the previous request's {prev}; expected non-decreasing arrivals",
                        r.arrival_ns
                    ),
                ));
            }
        }
        if !r.prompt_blocks.is_empty() {
            let want = blocks_for_tokens(r.prompt_tokens, self.block_size);
            if r.prompt_blocks.len() as u64 != want {
                return Err(FieldError::new(
                    "prompt_blocks",
                    format!(
                        "{} blocks for {} prompt tokens; expected ceil({}/{}) = {want}",
                        r.prompt_blocks.len(),
                        r.prompt_tokens,
                        r.prompt_tokens,
                        self.block_size
                    ),
                ));
            }
        }
        let mut visual: u64 = 0;
        for (i, img) in r.images.iter().enumerate() {
            self.check_image(i, img)?;
            visual += u64::from(img.visual_tokens);
        }
        if visual > u64::from(r.prompt_tokens) {
            return Err(FieldError::new(
                "images",
                format!(
                    "images carry {visual} visual tokens but the prompt has {}; expected prompt_tokens >= the sum of visual_tokens",
                    r.prompt_tokens
                ),
            ));
        }
        if let Some(f) = &r.fork {
            if f.branches == 0 {
                return Err(FieldError::new(
                    "fork.branches",
                    "expected at least 1 branch, found 0",
                ));
            }
            if f.output_tokens.len() as u64 != u64::from(f.branches) {
                return Err(FieldError::new(
                    "fork.output_tokens",
                    format!(
                        "{} entries for {} branches; expected one per branch",
                        f.output_tokens.len(),
                        f.branches
                    ),
                ));
            }
        }
        self.last_arrival_ns = Some(r.arrival_ns);
        Ok(())
    }

    fn check_image(&self, i: usize, img: &Image) -> Result<(), FieldError> {
        if img.visual_tokens == 0 {
            return Err(FieldError::new(
                format!("images[{i}].visual_tokens"),
                "expected at least 1 visual token, found 0",
            ));
        }
        match (img.width, img.height) {
            (Some(0), _) | (_, Some(0)) => {
                return Err(FieldError::new(
                    format!("images[{i}].width"),
                    "expected a positive pixel size, found 0",
                ))
            }
            (Some(_), None) | (None, Some(_)) => {
                return Err(FieldError::new(
                    format!("images[{i}].height"),
                    "width and height must be given together",
                ))
            }
            _ => {}
        }
        if let Some(g) = img.grid_thw {
            match visual_tokens_for_grid(g, self.spatial_merge) {
                Some(v) if v == img.visual_tokens => {}
                Some(v) => {
                    return Err(FieldError::new(
                        format!("images[{i}].visual_tokens"),
                        format!(
                            "{} visual tokens but grid_thw {:?} gives {v} (t*h*w/{}); expected them to agree",
                            img.visual_tokens,
                            g,
                            self.spatial_merge * self.spatial_merge
                        ),
                    ))
                }
                None => {
                    return Err(FieldError::new(
                        format!("images[{i}].grid_thw"),
                        format!(
                            "{g:?} is not a grid: expected positive t, h, w with h and w divisible by {}",
                            self.spatial_merge
                        ),
                    ))
                }
            }
        }
        Ok(())
    }
}

/// The serving engine reads a trace request through this view (no copy of the trace).
impl moonagent_core::serve::RequestView for Request {
    fn id(&self) -> u64 {
        self.id
    }
    fn session(&self) -> u64 {
        self.session
    }
    fn tenant(&self) -> u32 {
        self.tenant
    }
    fn prompt_tokens(&self) -> u32 {
        self.prompt_tokens
    }
    fn output_tokens(&self) -> u32 {
        self.output_tokens
    }
    fn prompt_blocks(&self) -> &[u64] {
        &self.prompt_blocks
    }
    fn image_count(&self) -> usize {
        self.images.len()
    }
    fn image(&self, i: usize) -> (u64, u32, Option<[u32; 3]>) {
        let im = &self.images[i];
        (im.content_id, im.visual_tokens, im.grid_thw)
    }
    fn branch_output_tokens(&self) -> &[u32] {
        self.fork.as_ref().map_or(&[], |f| &f.output_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen_tokens_match_the_processor() {
        // 448 and 1344 are multiples of 28: no resize, (H/14)(W/14)/4.
        assert_eq!(qwen25vl_visual_tokens(448, 448), Some(256));
        assert_eq!(qwen25vl_visual_tokens(1344, 1344), Some(2304));
        // 1000 px rounds to 1008 = 36 * 28.
        assert_eq!(qwen25vl_grid(1000, 1000), Some([1, 72, 72]));
        assert_eq!(qwen25vl_visual_tokens(0, 10), None);
        // Too small is scaled up to min_pixels.
        assert_eq!(qwen25vl_visual_tokens(10, 10), Some(4));
    }

    #[test]
    fn grids_with_a_zero_side_or_merge_have_no_tokens() {
        assert_eq!(visual_tokens_for_grid([2, 4, 6], 2), Some(12));
        for g in [[0, 4, 4], [1, 0, 4], [1, 4, 0], [0, 0, 0]] {
            assert_eq!(visual_tokens_for_grid(g, 2), None, "{g:?}");
        }
        assert_eq!(visual_tokens_for_grid([1, 4, 4], 0), None);
        assert_eq!(visual_tokens_for_grid([1, 3, 4], 2), None);
        assert_eq!(visual_tokens_for_grid([1, 4, 3], 2), None);
    }

    #[test]
    fn a_resized_side_beyond_u32_is_none_not_capped() {
        // factor 2^31 + 1: the width rounds to 2 factors (2^32 + 2 pixels), past u32; the
        // height to one factor, which fits. Capping the width would invent a grid.
        let f = (1u32 << 31) + 1;
        assert_eq!(smart_resize(u32::MAX / 100, u32::MAX, f, 0, u64::MAX), None);
        // The same on the height side.
        assert_eq!(smart_resize(u32::MAX, u32::MAX / 100, f, 0, u64::MAX), None);
    }

    #[test]
    fn smart_resize_matches_the_processors_reference() {
        // Expected values from the Hugging Face Qwen2-VL image processor's smart_resize
        // (Python, round half to even), with factor 28 and Qwen2.5-VL's pixel limits.
        let qwen = |h, w| smart_resize(h, w, 28, QWEN_MIN_PIXELS, QWEN_MAX_PIXELS);
        // Over max_pixels: scaled down by sqrt(h * w / max), floored to multiples of 28.
        assert_eq!(qwen(6000, 8000), Some((3080, 4116)));
        assert_eq!(qwen(3000, 9000), Some((2044, 6188)));
        assert_eq!(
            smart_resize(1000, 1000, 28, 3136, 200_000),
            Some((420, 420))
        );
        // Exactly max_pixels (3584 x 3584 after rounding) is kept, not scaled.
        assert_eq!(qwen(3586, 3586), Some((3584, 3584)));
        // Under min_pixels: scaled up.
        assert_eq!(qwen(10, 10), Some((56, 56)));
        // An aspect ratio of exactly 200 is processed; over 200 is refused.
        assert_eq!(qwen(1, 200), Some((28, 196)));
        assert_eq!(qwen(200, 1), Some((196, 28)));
        assert_eq!(qwen(1, 300), None);
        assert_eq!(qwen(300, 1), None);
        // Exactly min_pixels (56 x 56 after rounding) is kept, not scaled up.
        assert_eq!(qwen(50, 60), Some((56, 56)));
        // A side that rounds past u32::MAX is refused; exactly u32::MAX is kept.
        let big = (1u32 << 31) + 1;
        assert_eq!(smart_resize(u32::MAX, big, big, 0, u64::MAX), None);
        let m = u32::MAX;
        assert_eq!(smart_resize(m, m, m, 0, u64::MAX), Some((m, m)));
        // A zero factor is refused even when no pixel limit would catch it.
        assert_eq!(smart_resize(10, 10, 0, 0, u64::MAX), None);
    }

    #[test]
    fn blocks_are_ceilings() {
        assert_eq!(blocks_for_tokens(0, 512), 0);
        assert_eq!(blocks_for_tokens(512, 512), 1);
        assert_eq!(blocks_for_tokens(513, 512), 2);
        assert_eq!(tokens_in_block(513, 512, 1), 1);
        assert_eq!(tokens_in_block(513, 512, 0), 512);
    }

    fn forked_request() -> Request {
        Request {
            id: 7,
            arrival_ns: 100,
            session: 11,
            turn: 2,
            tenant: 3,
            prompt_tokens: 1300,
            prompt_blocks: vec![5, 6, 9],
            images: vec![
                Image::tokens_only(41, 64),
                Image::qwen25vl(42, 448, 448).expect("processable"),
            ],
            output_tokens: 20,
            fork: Some(Fork {
                branches: 2,
                output_tokens: vec![30, 45],
            }),
        }
    }

    #[test]
    fn request_totals_sum_images_and_branches() {
        let r = forked_request();
        assert_eq!(r.visual_tokens(), 64 + 256);
        assert_eq!(r.total_output_tokens(), 20 + 30 + 45);
        let plain = Request { fork: None, ..r };
        assert_eq!(plain.total_output_tokens(), 20);
    }

    #[test]
    fn request_view_reads_every_field() {
        use moonagent_core::serve::RequestView;
        let r = forked_request();
        assert_eq!(
            (r.id(), r.session(), r.tenant()),
            (7, 11, 3),
            "id, session, tenant"
        );
        assert_eq!(
            (
                RequestView::prompt_tokens(&r),
                RequestView::output_tokens(&r)
            ),
            (1300, 20)
        );
        assert_eq!(RequestView::prompt_blocks(&r), &[5, 6, 9]);
        assert_eq!(r.image_count(), 2);
        assert_eq!(r.image(0), (41, 64, None));
        assert_eq!(r.image(1), (42, 256, Some([1, 32, 32])));
        assert_eq!(r.branch_output_tokens(), &[30, 45]);
        let plain = Request { fork: None, ..r };
        assert!(plain.branch_output_tokens().is_empty());
    }
}
