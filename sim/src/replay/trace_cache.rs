//! The compiled-trace cache: the first replay of a trace writes its [`Compiled`] form
//! (accesses with next accesses and re-reference marks, dense object numbers) as one flat
//! little-endian file, named by a hash of the trace's bytes, the compile options and the
//! format version; a later replay of the same trace maps that file (`memmap2`) and skips
//! reading and compiling. The mapped arrays are read in place ([`super::Slab`]), no copy.
//!
//! File layout (version [`VERSION`], all integers little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | magic `MOONTRC\0` |
//! | 8..12 | version (u32) |
//! | 12..16 | `size_of::<Access>()` (u32, 32) |
//! | 16..32 | key ([`TraceKey`], 16 bytes) |
//! | 32..40 | requests (u64) |
//! | 40..48 | accesses `n` (u64) |
//! | 48..52 | distinct objects (u32) |
//! | 52..56 | zero |
//! | 56..64 | checksum: xxh3-64 of bytes 0..56 and of the payload |
//! | 64..64+32n | `n` accesses, [`Access`]'s `repr(C)` layout |
//! | ..+4n | `n` object numbers (u32) |
//!
//! A file is used only when its length, magic, version, record size, key and checksum all
//! hold and its contents are in range (every `next` after its access or [`NEVER`], every
//! object number below `distinct`, every data type known, no unknown flag bits), so that no
//! file, however damaged, can make a replay index out of bounds; anything else is reported
//! as [`Stale`] and the caller compiles the trace again and overwrites it. Writes go to a
//! temporary file in the same directory, renamed into place, so a reader sees a whole file
//! or none; a crash that loses the data of a renamed file leaves a checksum mismatch, which
//! is rebuilt. Mapping is sound only while nobody truncates or rewrites the file in place:
//! this module never does (it only renames new files over old ones, which leaves an
//! existing mapping intact).
//!
//! The key is xxh3-128 of the format version, the caller's description of everything else
//! the compile depends on (`extra`: trace format, options, cost model) and the trace's
//! bytes. xxh3 rather than BLAKE2b: it is not a cryptographic hash (a crafted collision
//! could substitute a trace; the cache is the user's own directory) but hashes at memory
//! speed, far below the cost of parsing the trace (measured in `sim/README.md`).
//!
//! Big-endian hosts do not use the cache ([`Stale::Unsupported`]).

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::{Mmap, MmapOptions};
use moonagent_core::store::DataType;
use xxhash_rust::xxh3::Xxh3;
use zerocopy::IntoBytes;

use super::{Access, Compiled, Slab, FIRST_KV, NEVER, REUSE};

/// The file format's version; bump it whenever the layout or the meaning of a compiled
/// field changes.
pub const VERSION: u32 = 1;
/// The file's first 8 bytes.
pub const MAGIC: [u8; 8] = *b"MOONTRC\0";
/// Header bytes before the accesses.
pub const HEADER: usize = 64;
const RECORD: usize = std::mem::size_of::<Access>();

/// What names a compiled trace: xxh3-128 of the format version, the compile's description
/// and the trace bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceKey(pub [u8; 16]);

impl TraceKey {
    /// The key in lower-case hexadecimal (the cache file's stem).
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Builds a [`TraceKey`]: the version and `extra` first, then the trace's bytes in pieces.
pub struct KeyHasher(Xxh3);

impl KeyHasher {
    /// A hasher for a trace compiled as `extra` describes.
    pub fn new(extra: &[u8]) -> Self {
        let mut h = Xxh3::new();
        h.update(&MAGIC);
        h.update(&VERSION.to_le_bytes());
        h.update(&(extra.len() as u64).to_le_bytes());
        h.update(extra);
        Self(h)
    }

    /// Add trace bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The key.
    pub fn finish(&self) -> TraceKey {
        TraceKey(self.0.digest128().to_le_bytes())
    }
}

/// The key of trace bytes held in memory.
pub fn key_of_bytes(bytes: &[u8], extra: &[u8]) -> TraceKey {
    let mut h = KeyHasher::new(extra);
    h.update(bytes);
    h.finish()
}

/// The key of a trace file, read in 1 MiB pieces.
pub fn key_of_file(path: &Path, extra: &[u8]) -> io::Result<TraceKey> {
    let mut f = File::open(path)?;
    let mut h = KeyHasher::new(extra);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(h.finish());
        }
        h.update(&buf[..n]);
    }
}

/// Why a cache file was not used (the trace is compiled again and the file rewritten).
#[derive(Debug, thiserror::Error)]
pub enum Stale {
    /// No file for the key.
    #[error("no compiled trace yet")]
    Missing,
    /// The file could not be opened or mapped.
    #[error("could not read it: {0}")]
    Io(#[from] io::Error),
    /// Shorter than its header, or not header + 36 bytes per access.
    #[error("wrong length: {found} bytes, expected {expected}")]
    Length {
        /// Bytes expected.
        expected: u64,
        /// Bytes found.
        found: u64,
    },
    /// Not a compiled-trace file.
    #[error("wrong magic")]
    Magic,
    /// Written by another version of the format (or of `Access`).
    #[error("format version {found} (record {record} bytes), expected {VERSION} ({RECORD} bytes)")]
    Version {
        /// The file's version.
        found: u32,
        /// The file's record size.
        record: u32,
    },
    /// The header names another trace.
    #[error("the header's key does not match its name")]
    Key,
    /// The bytes do not match their checksum.
    #[error("checksum mismatch")]
    Checksum,
    /// The checksum holds but a field is out of range.
    #[error("invalid contents: {0}")]
    Invalid(String),
    /// Big-endian host.
    #[error("the cache is little-endian only")]
    Unsupported,
}

/// A directory of compiled traces, kept under a size limit: after each write the least
/// recently used files (by modification time, which a load refreshes) are removed until
/// the directory's compiled traces fit. Removing a file another process has mapped is
/// safe: the mapping keeps the data until it is dropped.
#[derive(Debug, Clone)]
pub struct TraceCache {
    dir: PathBuf,
    max_bytes: u64,
}

/// The cache's default size limit (8 GiB: about 22 compiled traces of 10M requests).
pub const DEFAULT_MAX_BYTES: u64 = 8 << 30;

/// Temporary files older than this are a crashed writer's, removed when pruning.
const STALE_TMP: std::time::Duration = std::time::Duration::from_secs(3600);

fn checksum(head: &[u8], accesses: &[u8], objects: &[u8]) -> u64 {
    let mut h = Xxh3::new();
    h.update(&head[..56]);
    h.update(accesses);
    h.update(objects);
    h.digest()
}

fn header(key: &TraceKey, c: &Compiled) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[0..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(RECORD as u32).to_le_bytes());
    h[16..32].copy_from_slice(&key.0);
    h[32..40].copy_from_slice(&c.requests.to_le_bytes());
    h[40..48].copy_from_slice(&(c.accesses.len() as u64).to_le_bytes());
    h[48..52].copy_from_slice(&c.distinct.to_le_bytes());
    let sum = checksum(&h, c.accesses.as_bytes(), c.objects.as_bytes());
    h[56..64].copy_from_slice(&sum.to_le_bytes());
    h
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Check a mapped file and view it as a [`Compiled`] (see the module docs for what is
/// checked).
pub fn decode(map: Arc<Mmap>, key: &TraceKey) -> Result<Compiled, Stale> {
    if cfg!(target_endian = "big") {
        return Err(Stale::Unsupported);
    }
    let b: &[u8] = &map;
    let found = b.len() as u64;
    if b.len() < HEADER {
        return Err(Stale::Length {
            expected: HEADER as u64,
            found,
        });
    }
    if b[0..8] != MAGIC {
        return Err(Stale::Magic);
    }
    let (version, record) = (u32_at(b, 8), u32_at(b, 12));
    if version != VERSION || record as usize != RECORD {
        return Err(Stale::Version {
            found: version,
            record,
        });
    }
    if b[16..32] != key.0 {
        return Err(Stale::Key);
    }
    let requests = u64_at(b, 32);
    let n = u64_at(b, 40);
    let distinct = u32_at(b, 48);
    let expected = n
        .checked_mul(RECORD as u64 + 4)
        .and_then(|x| x.checked_add(HEADER as u64));
    if expected != Some(found) {
        return Err(Stale::Length {
            expected: expected.unwrap_or(u64::MAX),
            found,
        });
    }
    let n = n as usize;
    let acc_end = HEADER + n * RECORD;
    if checksum(&b[..HEADER], &b[HEADER..acc_end], &b[acc_end..]) != u64_at(b, 56) {
        return Err(Stale::Checksum);
    }
    if n >= NEVER as usize || u32_at(b, 52) != 0 {
        return Err(Stale::Invalid("header fields out of range".into()));
    }
    let accesses = Slab::<Access>::mapped(Arc::clone(&map), HEADER, n)
        .ok_or_else(|| Stale::Invalid("accesses misaligned".into()))?;
    let objects = Slab::<u32>::mapped(Arc::clone(&map), acc_end, n)
        .ok_or_else(|| Stale::Invalid("object numbers misaligned".into()))?;
    let kinds = DataType::COUNT as u8;
    for (i, (a, &o)) in accesses.iter().zip(objects.iter()).enumerate() {
        let next_ok = a.next == NEVER || (a.next as usize > i && (a.next as usize) < n);
        if !next_ok
            || o >= distinct
            || a.dtype >= kinds
            || a.flags & !(FIRST_KV | REUSE) != 0
            || a._pad != 0
        {
            return Err(Stale::Invalid(format!("access {i} out of range")));
        }
    }
    Ok(Compiled {
        accesses,
        requests,
        objects,
        distinct,
    })
}

impl TraceCache {
    /// A cache in `dir` (created on the first write), limited to
    /// `$MOONAGENT_CACHE_MAX_BYTES` bytes (0: no limit), else [`DEFAULT_MAX_BYTES`].
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let max_bytes = std::env::var("MOONAGENT_CACHE_MAX_BYTES")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(DEFAULT_MAX_BYTES, |n| if n == 0 { u64::MAX } else { n });
        Self {
            dir: dir.into(),
            max_bytes,
        }
    }

    /// The same cache with a size limit of `max_bytes`.
    pub fn with_max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// The size limit, bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Remove the least recently used compiled traces (never `keep`) until the rest fit
    /// the size limit, and temporary files older than an hour; returns the files removed.
    pub fn prune(&self, keep: &Path) -> io::Result<Vec<PathBuf>> {
        let now = std::time::SystemTime::now();
        let mut files = Vec::new();
        let mut total = 0u64;
        let mut removed = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let path = entry.path();
            let Ok(meta) = entry.metadata() else { continue };
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let modified = meta.modified().unwrap_or(now);
            if name.contains(".mtc.tmp") {
                if now
                    .duration_since(modified)
                    .is_ok_and(|age| age > STALE_TMP)
                    && std::fs::remove_file(&path).is_ok()
                {
                    removed.push(path);
                }
                continue;
            }
            if !name.ends_with(".mtc") {
                continue;
            }
            total += meta.len();
            files.push((modified, path, meta.len()));
        }
        // Oldest first; ties by name, so the choice is the same on every run.
        files.sort();
        for (_, path, len) in files {
            if total <= self.max_bytes {
                break;
            }
            if path == keep {
                continue;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
                removed.push(path);
            }
        }
        Ok(removed)
    }

    /// `$MOONAGENT_CACHE`, else `$XDG_CACHE_HOME/moonagent/compiled`, else
    /// `$HOME/.cache/moonagent/compiled`; `None` when none is set.
    pub fn default_dir() -> Option<PathBuf> {
        let var = |k| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        var("MOONAGENT_CACHE").or_else(|| {
            var("XDG_CACHE_HOME")
                .or_else(|| var("HOME").map(|h| h.join(".cache")))
                .map(|d| d.join("moonagent").join("compiled"))
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of `key`.
    pub fn path(&self, key: &TraceKey) -> PathBuf {
        self.dir.join(format!("{}.mtc", key.hex()))
    }

    /// Map the compiled trace of `key`, checked (see the module docs).
    pub fn load(&self, key: &TraceKey) -> Result<Compiled, Stale> {
        if cfg!(target_endian = "big") {
            return Err(Stale::Unsupported);
        }
        let f = match File::open(self.path(key)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Stale::Missing),
            Err(e) => return Err(e.into()),
        };
        if f.metadata()?.len() < HEADER as u64 {
            // Too short to map usefully (an empty file cannot be mapped at all).
            return Err(Stale::Length {
                expected: HEADER as u64,
                found: f.metadata()?.len(),
            });
        }
        // SAFETY: the file is only ever created whole and renamed into place by `store`,
        // never truncated or written in place (module docs), so the mapped bytes do not
        // change under the mapping; they are checked before any is read as an access.
        let map = unsafe { MmapOptions::new().populate().map(&f)? };
        let c = decode(Arc::new(map), key)?;
        // Used now: the last to go when the cache is pruned (best effort).
        let _ = f.set_modified(std::time::SystemTime::now());
        Ok(c)
    }

    /// Write `c` as the compiled trace of `key`: a temporary file renamed into place.
    pub fn store(&self, key: &TraceKey, c: &Compiled) -> io::Result<PathBuf> {
        if cfg!(target_endian = "big") {
            return Err(io::Error::other("the trace cache is little-endian only"));
        }
        if c.objects.len() != c.accesses.len() {
            return Err(io::Error::other("compiled trace not filled (fill_next)"));
        }
        std::fs::create_dir_all(&self.dir)?;
        let path = self.path(key);
        let tmp = self
            .dir
            .join(format!("{}.mtc.tmp{}", key.hex(), std::process::id()));
        let write = || -> io::Result<()> {
            let mut w = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
            w.write_all(&header(key, c))?;
            w.write_all(c.accesses.as_bytes())?;
            w.write_all(c.objects.as_bytes())?;
            w.into_inner().map_err(|e| e.into_error())?;
            std::fs::rename(&tmp, &path)
        };
        write().inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        self.prune(&path)?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A test's own directory under the system temp dir, emptied first and removed when
    /// dropped (also when the test fails), so no run leaves one behind.
    struct TmpDir(PathBuf);

    impl std::ops::Deref for TmpDir {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TmpDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn dir(name: &str) -> TmpDir {
        let d =
            std::env::temp_dir().join(format!("moonagent-tcache-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        TmpDir(d)
    }

    fn og(recs: &[(u32, u64, u32)]) -> Vec<u8> {
        let mut v = Vec::new();
        for &(ts, id, size) in recs {
            v.extend_from_slice(&ts.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
            v.extend_from_slice(&size.to_le_bytes());
            v.extend_from_slice(&(-1i64).to_le_bytes());
        }
        v
    }

    fn sample() -> (Vec<u8>, Compiled) {
        let b = og(&[(1, 7, 10), (2, 8, 20), (3, 7, 10), (3, 9, 5), (4, 8, 20)]);
        let c = Compiled::from_oracle_general_bytes(&b).unwrap();
        (b, c)
    }

    /// The cache keeps to its size limit by removing the least recently used files (a
    /// load counts as a use), never the one just written; a crashed writer's old
    /// temporary file goes too.
    #[test]
    fn the_cache_keeps_to_its_limit_removing_the_least_recently_used() {
        let d = dir("prune");
        let (_, c) = sample();
        let keys: Vec<TraceKey> = (0..4u8).map(|i| key_of_bytes(&[i], b"x")).collect();
        let one = {
            let probe = TraceCache::new(&*d).with_max_bytes(u64::MAX);
            let p = probe.store(&keys[0], &c).unwrap();
            std::fs::metadata(p).unwrap().len()
        };
        // Room for three files.
        let cache = TraceCache::new(&*d).with_max_bytes(3 * one);
        let t0 = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        let age = |k: &TraceKey, secs: u64| {
            let f = File::options().write(true).open(cache.path(k)).unwrap();
            f.set_modified(t0 + std::time::Duration::from_secs(secs))
                .unwrap();
        };
        cache.store(&keys[1], &c).unwrap();
        cache.store(&keys[2], &c).unwrap();
        age(&keys[0], 1);
        age(&keys[1], 2);
        age(&keys[2], 3);
        // A load makes key 0 the most recent.
        cache.load(&keys[0]).unwrap();
        let tmp = d.join("dead.mtc.tmp1");
        std::fs::write(&tmp, b"half").unwrap();
        File::options()
            .write(true)
            .open(&tmp)
            .unwrap()
            .set_modified(t0)
            .unwrap();
        cache.store(&keys[3], &c).unwrap();
        let exists = |k: &TraceKey| cache.path(k).exists();
        assert!(!exists(&keys[1]), "the least recently used one stays");
        assert!(exists(&keys[0]) && exists(&keys[2]) && exists(&keys[3]));
        assert!(!tmp.exists(), "an hour-old temporary file stays");
        // A limit below one file keeps the file just written.
        let tiny = TraceCache::new(&*d).with_max_bytes(1);
        let p = tiny.store(&keys[1], &c).unwrap();
        assert!(p.exists());
        assert_eq!(std::fs::read_dir(&*d).unwrap().count(), 1);
    }

    #[test]
    fn a_stored_trace_maps_back_equal_without_a_copy() {
        let (b, c) = sample();
        let d = dir("roundtrip");
        let cache = TraceCache::new(&*d);
        let key = key_of_bytes(&b, b"oracle-general");
        assert!(matches!(cache.load(&key), Err(Stale::Missing)));
        let path = cache.store(&key, &c).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().len() as usize,
            HEADER + 36 * c.accesses.len()
        );
        let m = cache.load(&key).unwrap();
        assert!(m.accesses.is_mapped() && m.objects.is_mapped());
        assert_eq!(m.accesses, c.accesses);
        assert_eq!(m.objects, c.objects);
        assert_eq!((m.requests, m.distinct), (c.requests, c.distinct));
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(cache.dir()).unwrap().count(), 1);
        // Editing a mapped trace copies it first (copy on write); the file is untouched.
        let mut m2 = m.clone();
        m2.fill_next();
        assert!(!m2.accesses.is_mapped());
        assert_eq!(m2.accesses, c.accesses);
        assert_eq!(cache.load(&key).unwrap().accesses, c.accesses);
    }

    #[test]
    fn keys_follow_the_bytes_and_the_compile_description() {
        let (b, _) = sample();
        let k = key_of_bytes(&b, b"x");
        assert_eq!(k, key_of_bytes(&b, b"x"));
        assert_ne!(k, key_of_bytes(&b, b"y"));
        let mut b2 = b.clone();
        b2[5] ^= 1;
        assert_ne!(k, key_of_bytes(&b2, b"x"));
        // Streaming in pieces gives the same key as one piece.
        let p = dir("key").with_extension("bin");
        std::fs::write(&p, &b).unwrap();
        assert_eq!(key_of_file(&p, b"x").unwrap(), k);
        let _ = std::fs::remove_file(&p);
    }

    /// Damage the stored file with `f`, then expect `load` to refuse it as `want` says.
    fn damaged(name: &str, f: impl FnOnce(&mut Vec<u8>), want: fn(&Stale) -> bool) {
        let (b, c) = sample();
        let d = dir(name);
        let cache = TraceCache::new(&*d);
        let key = key_of_bytes(&b, b"og");
        let path = cache.store(&key, &c).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        f(&mut bytes);
        std::fs::write(&path, &bytes).unwrap();
        let e = cache.load(&key).unwrap_err();
        assert!(want(&e), "{name}: got {e:?}");
        // Rebuilt: a fresh store over it loads again.
        cache.store(&key, &c).unwrap();
        assert_eq!(cache.load(&key).unwrap().accesses, c.accesses);
    }

    /// Rewrite the checksum so that only the content checks can catch a change.
    fn reseal(b: &mut [u8]) {
        let n = u64_at(b, 40) as usize;
        let end = HEADER + n * RECORD;
        let sum = checksum(&b[..HEADER], &b[HEADER..end], &b[end..]);
        b[56..64].copy_from_slice(&sum.to_le_bytes());
    }

    #[test]
    fn stale_or_corrupt_files_are_refused_and_rebuilt() {
        damaged(
            "empty",
            |b| b.clear(),
            |e| matches!(e, Stale::Length { .. }),
        );
        damaged(
            "short",
            |b| b.truncate(40),
            |e| matches!(e, Stale::Length { .. }),
        );
        damaged(
            "truncated",
            |b| {
                b.pop();
            },
            |e| matches!(e, Stale::Length { .. }),
        );
        damaged(
            "longer",
            |b| b.extend([0; 36]),
            |e| matches!(e, Stale::Length { .. }),
        );
        damaged("magic", |b| b[0] = b'X', |e| matches!(e, Stale::Magic));
        damaged(
            "version",
            |b| b[8] = 99,
            |e| matches!(e, Stale::Version { found: 99, .. }),
        );
        damaged(
            "record",
            |b| b[12] = 24,
            |e| matches!(e, Stale::Version { record: 24, .. }),
        );
        damaged("key", |b| b[20] ^= 1, |e| matches!(e, Stale::Key));
        damaged(
            "payload",
            |b| b[HEADER + 9] ^= 1,
            |e| matches!(e, Stale::Checksum),
        );
        damaged(
            "objects",
            |b| *b.last_mut().unwrap() ^= 1,
            |e| matches!(e, Stale::Checksum),
        );
        damaged("requests", |b| b[33] ^= 1, |e| matches!(e, Stale::Checksum));
        damaged("sum", |b| b[60] ^= 1, |e| matches!(e, Stale::Checksum));
        // Checksum resealed: the range checks still refuse what a replay would index by.
        damaged(
            "object-range",
            |b| {
                let last = b.len() - 4;
                b[last..].copy_from_slice(&99u32.to_le_bytes());
                reseal(b);
            },
            |e| matches!(e, Stale::Invalid(_)),
        );
        damaged(
            "next-backwards",
            |b| {
                // Access 2's `next` (offset 24 in the record) pointing back at access 0.
                let at = HEADER + 2 * RECORD + 24;
                b[at..at + 4].copy_from_slice(&0u32.to_le_bytes());
                reseal(b);
            },
            |e| matches!(e, Stale::Invalid(_)),
        );
        damaged(
            "dtype",
            |b| {
                b[HEADER + 28] = 200;
                reseal(b);
            },
            |e| matches!(e, Stale::Invalid(_)),
        );
        damaged(
            "flags",
            |b| {
                b[HEADER + 30] |= 0x80;
                reseal(b);
            },
            |e| matches!(e, Stale::Invalid(_)),
        );
    }

    #[test]
    fn an_access_is_32_bytes_in_the_documented_order() {
        let a = Access {
            time: 1,
            id: 2,
            size: 3,
            penalty_ns: 4,
            next: 5,
            dtype: 6,
            tenant: 7,
            flags: 1,
            _pad: 0,
        };
        let mut want = Vec::new();
        want.extend(1u64.to_le_bytes());
        want.extend(2u64.to_le_bytes());
        want.extend(3u32.to_le_bytes());
        want.extend(4u32.to_le_bytes());
        want.extend(5u32.to_le_bytes());
        want.extend([6, 7, 1, 0]);
        assert_eq!(a.as_bytes(), &want[..]);
    }

    proptest! {
        /// Any compiled trace maps back equal.
        #[test]
        fn any_trace_round_trips(recs in proptest::collection::vec(
            (0u32..50, 0u64..20, 0u32..100), 0..80)) {
            let b = og(&recs);
            let c = Compiled::from_oracle_general_bytes(&b).unwrap();
            let d = dir("prop");
            let cache = TraceCache::new(&*d);
            let key = key_of_bytes(&b, b"");
            cache.store(&key, &c).unwrap();
            let m = cache.load(&key).unwrap();
            prop_assert_eq!(&m.accesses, &c.accesses);
            prop_assert_eq!(&m.objects, &c.objects);
            prop_assert_eq!((m.requests, m.distinct), (c.requests, c.distinct));
        }
    }
}
