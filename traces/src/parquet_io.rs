//! Parquet: the fast format.
//!
//! One row per request, written in row groups of [`ROW_GROUP_ROWS`] requests with snappy
//! pages; nested lists for prompt blocks, images and fork branches. The header is stored
//! as JSON under the key-value metadata key [`HEADER_KEY`]. The reader decodes one record
//! batch at a time (memory bounded by a row group, constant in trace length), checks the
//! column types once, and runs the [`Validator`] on each row.

use std::fs::File;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{UInt32Type, UInt64Type};
use arrow_array::{
    Array, ArrayRef, ListArray, PrimitiveArray, RecordBatch, StructArray, UInt32Array, UInt64Array,
};
use arrow_buffer::{NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::reader::ChunkReader;

use crate::error::{Location, TraceError};
use crate::schema::{Fork, Image, Request, TraceHeader, Validator, SCHEMA_VERSION};

/// Parquet key-value metadata key that holds the header as JSON.
pub const HEADER_KEY: &str = "moonagent.trace.header";
/// Requests per row group.
pub const ROW_GROUP_ROWS: usize = 65_536;
/// Requests per record batch, on write and on read.
pub const BATCH_ROWS: usize = 8_192;

fn list_of(item: DataType) -> DataType {
    DataType::List(Arc::new(Field::new("item", item, false)))
}

fn image_fields() -> Fields {
    Fields::from(vec![
        Field::new("content_id", DataType::UInt64, false),
        Field::new("width", DataType::UInt32, true),
        Field::new("height", DataType::UInt32, true),
        Field::new("visual_tokens", DataType::UInt32, false),
        Field::new("grid_t", DataType::UInt32, true),
        Field::new("grid_h", DataType::UInt32, true),
        Field::new("grid_w", DataType::UInt32, true),
    ])
}

/// The Arrow schema of a trace table.
pub fn arrow_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::UInt64, false),
        Field::new("arrival_ns", DataType::UInt64, false),
        Field::new("session", DataType::UInt64, false),
        Field::new("turn", DataType::UInt32, false),
        Field::new("tenant", DataType::UInt32, false),
        Field::new("prompt_tokens", DataType::UInt32, false),
        Field::new("prompt_blocks", list_of(DataType::UInt64), false),
        Field::new("images", list_of(DataType::Struct(image_fields())), false),
        Field::new("output_tokens", DataType::UInt32, false),
        Field::new("fork_branches", DataType::UInt32, true),
        Field::new("fork_output_tokens", list_of(DataType::UInt32), true),
    ]))
}

/// Column buffers for one batch of requests.
#[derive(Default)]
struct Columns {
    id: Vec<u64>,
    arrival_ns: Vec<u64>,
    session: Vec<u64>,
    turn: Vec<u32>,
    tenant: Vec<u32>,
    prompt_tokens: Vec<u32>,
    block_offsets: Vec<i32>,
    blocks: Vec<u64>,
    image_offsets: Vec<i32>,
    img_content: Vec<u64>,
    img_width: Vec<u32>,
    img_width_valid: Vec<bool>,
    img_height: Vec<u32>,
    img_height_valid: Vec<bool>,
    img_tokens: Vec<u32>,
    img_grid: [Vec<u32>; 3],
    img_grid_valid: Vec<bool>,
    output_tokens: Vec<u32>,
    fork_branches: Vec<u32>,
    fork_valid: Vec<bool>,
    fork_offsets: Vec<i32>,
    fork_tokens: Vec<u32>,
}

fn offset_i32(n: usize, file: &Path, what: &str) -> Result<i32, TraceError> {
    i32::try_from(n).map_err(|_| {
        TraceError::invalid(
            file,
            Location::File,
            what,
            "more than 2^31 list items in one batch; expected fewer",
        )
    })
}

impl Columns {
    fn len(&self) -> usize {
        self.id.len()
    }

    fn push(&mut self, r: &Request, file: &Path) -> Result<(), TraceError> {
        if self.block_offsets.is_empty() {
            self.block_offsets.push(0);
            self.image_offsets.push(0);
            self.fork_offsets.push(0);
        }
        self.id.push(r.id);
        self.arrival_ns.push(r.arrival_ns);
        self.session.push(r.session);
        self.turn.push(r.turn);
        self.tenant.push(r.tenant);
        self.prompt_tokens.push(r.prompt_tokens);
        self.blocks.extend_from_slice(&r.prompt_blocks);
        self.block_offsets
            .push(offset_i32(self.blocks.len(), file, "prompt_blocks")?);
        for img in &r.images {
            self.img_content.push(img.content_id);
            self.img_width.push(img.width.unwrap_or(0));
            self.img_width_valid.push(img.width.is_some());
            self.img_height.push(img.height.unwrap_or(0));
            self.img_height_valid.push(img.height.is_some());
            self.img_tokens.push(img.visual_tokens);
            let g = img.grid_thw.unwrap_or([0; 3]);
            for (col, v) in self.img_grid.iter_mut().zip(g) {
                col.push(v);
            }
            self.img_grid_valid.push(img.grid_thw.is_some());
        }
        self.image_offsets
            .push(offset_i32(self.img_content.len(), file, "images")?);
        self.output_tokens.push(r.output_tokens);
        match &r.fork {
            Some(f) => {
                self.fork_branches.push(f.branches);
                self.fork_valid.push(true);
                self.fork_tokens.extend_from_slice(&f.output_tokens);
            }
            None => {
                self.fork_branches.push(0);
                self.fork_valid.push(false);
            }
        }
        self.fork_offsets.push(offset_i32(
            self.fork_tokens.len(),
            file,
            "fork_output_tokens",
        )?);
        Ok(())
    }

    fn take_batch(
        &mut self,
        schema: &SchemaRef,
    ) -> Result<RecordBatch, parquet::errors::ParquetError> {
        let c = std::mem::take(self);
        fn nulls(valid: Vec<bool>) -> Option<NullBuffer> {
            if valid.iter().all(|&v| v) {
                None
            } else {
                Some(NullBuffer::from(valid))
            }
        }
        fn u64a(v: Vec<u64>) -> ArrayRef {
            Arc::new(UInt64Array::new(ScalarBuffer::from(v), None))
        }
        fn u32a(v: Vec<u32>, n: Option<NullBuffer>) -> ArrayRef {
            Arc::new(UInt32Array::new(ScalarBuffer::from(v), n))
        }
        let item = |dt: DataType| Arc::new(Field::new("item", dt, false));
        let blocks = ListArray::try_new(
            item(DataType::UInt64),
            OffsetBuffer::new(ScalarBuffer::from(c.block_offsets)),
            u64a(c.blocks),
            None,
        )?;
        let [gt, gh, gw] = c.img_grid;
        let grid_nulls = nulls(c.img_grid_valid);
        let images_struct = StructArray::try_new(
            image_fields(),
            vec![
                u64a(c.img_content),
                u32a(c.img_width, nulls(c.img_width_valid)),
                u32a(c.img_height, nulls(c.img_height_valid)),
                u32a(c.img_tokens, None),
                u32a(gt, grid_nulls.clone()),
                u32a(gh, grid_nulls.clone()),
                u32a(gw, grid_nulls),
            ],
            None,
        )?;
        let images = ListArray::try_new(
            item(DataType::Struct(image_fields())),
            OffsetBuffer::new(ScalarBuffer::from(c.image_offsets)),
            Arc::new(images_struct),
            None,
        )?;
        let fork_nulls = nulls(c.fork_valid);
        let fork_tokens = ListArray::try_new(
            item(DataType::UInt32),
            OffsetBuffer::new(ScalarBuffer::from(c.fork_offsets)),
            u32a(c.fork_tokens, None),
            fork_nulls.clone(),
        )?;
        let cols: Vec<ArrayRef> = vec![
            u64a(c.id),
            u64a(c.arrival_ns),
            u64a(c.session),
            u32a(c.turn, None),
            u32a(c.tenant, None),
            u32a(c.prompt_tokens, None),
            Arc::new(blocks),
            Arc::new(images),
            u32a(c.output_tokens, None),
            u32a(c.fork_branches, fork_nulls),
            Arc::new(fork_tokens),
        ];
        Ok(RecordBatch::try_new(schema.clone(), cols)?)
    }
}

/// Streaming Parquet trace writer; validates what it writes.
pub struct ParquetWriter<W: Write + Send> {
    writer: Option<ArrowWriter<W>>,
    schema: SchemaRef,
    cols: Columns,
    file: PathBuf,
    validator: Validator,
    written: u64,
}

fn pq_err(file: &Path, at: Location, e: impl std::fmt::Display) -> TraceError {
    TraceError::invalid(file, at, "(parquet)", e.to_string())
}

impl ParquetWriter<File> {
    /// Create `path`; the header goes into the file's key-value metadata.
    pub fn create(path: impl AsRef<Path>, header: &TraceHeader) -> Result<Self, TraceError> {
        let path = path.as_ref();
        let f = File::create(path).map_err(|e| TraceError::io(path, e))?;
        Self::new(f, path, header)
    }
}

impl<W: Write + Send> ParquetWriter<W> {
    /// Write a Parquet trace to any writer; `file` names it in errors.
    pub fn new(out: W, file: impl AsRef<Path>, header: &TraceHeader) -> Result<Self, TraceError> {
        let file = file.as_ref().to_path_buf();
        header.check().map_err(|e| e.at(&file, Location::File))?;
        let header_json =
            serde_json::to_string(header).map_err(|e| pq_err(&file, Location::File, e))?;
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .set_key_value_metadata(Some(vec![KeyValue::new(
                HEADER_KEY.to_string(),
                header_json,
            )]))
            .build();
        let schema = arrow_schema();
        let writer = ArrowWriter::try_new(out, schema.clone(), Some(props))
            .map_err(|e| pq_err(&file, Location::File, e))?;
        Ok(Self {
            writer: Some(writer),
            schema,
            cols: Columns::default(),
            validator: Validator::new(header),
            file,
            written: 0,
        })
    }

    /// Validate and append one request.
    pub fn write(&mut self, r: &Request) -> Result<(), TraceError> {
        let at = Location::Request(self.written + 1);
        self.validator.check(r).map_err(|e| e.at(&self.file, at))?;
        self.cols.push(r, &self.file)?;
        self.written += 1;
        if self.cols.len() >= BATCH_ROWS {
            self.flush_batch()?;
        }
        Ok(())
    }

    fn flush_batch(&mut self) -> Result<(), TraceError> {
        if self.cols.len() == 0 {
            return Ok(());
        }
        let at = Location::Request(self.written);
        let batch = self
            .cols
            .take_batch(&self.schema)
            .map_err(|e| pq_err(&self.file, at, e))?;
        match self.writer.as_mut() {
            Some(w) => w.write(&batch).map_err(|e| pq_err(&self.file, at, e)),
            None => Err(pq_err(&self.file, at, "writer already finished")),
        }
    }

    /// Requests written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Write the last row group and the footer; returns the inner writer.
    pub fn finish(mut self) -> Result<W, TraceError> {
        self.flush_batch()?;
        let w = self
            .writer
            .take()
            .ok_or_else(|| pq_err(&self.file, Location::File, "writer already finished"))?;
        w.into_inner()
            .map_err(|e| pq_err(&self.file, Location::File, e))
    }
}

/// Typed views of one decoded batch.
struct BatchView {
    rows: usize,
    id: UInt64Array,
    arrival_ns: UInt64Array,
    session: UInt64Array,
    turn: UInt32Array,
    tenant: UInt32Array,
    prompt_tokens: UInt32Array,
    blocks: ListArray,
    block_values: UInt64Array,
    images: ListArray,
    img_content: UInt64Array,
    img_width: UInt32Array,
    img_height: UInt32Array,
    img_tokens: UInt32Array,
    img_grid: [UInt32Array; 3],
    output_tokens: UInt32Array,
    fork_branches: UInt32Array,
    fork_tokens: ListArray,
    fork_values: UInt32Array,
}

fn column<'a>(batch: &'a RecordBatch, name: &str, file: &Path) -> Result<&'a ArrayRef, TraceError> {
    batch.column_by_name(name).ok_or_else(|| {
        TraceError::invalid(
            file,
            Location::File,
            name,
            "column missing; expected it in the trace schema",
        )
    })
}

fn prim<T: arrow_array::ArrowPrimitiveType>(
    a: &dyn Array,
    name: &str,
    file: &Path,
) -> Result<PrimitiveArray<T>, TraceError> {
    a.as_primitive_opt::<T>().cloned().ok_or_else(|| {
        TraceError::invalid(
            file,
            Location::File,
            name,
            format!(
                "column has type {}, expected {}",
                a.data_type(),
                T::DATA_TYPE
            ),
        )
    })
}

fn list(a: &dyn Array, name: &str, file: &Path) -> Result<ListArray, TraceError> {
    a.as_list_opt::<i32>().cloned().ok_or_else(|| {
        TraceError::invalid(
            file,
            Location::File,
            name,
            format!("column has type {}, expected a list", a.data_type()),
        )
    })
}

impl BatchView {
    fn new(batch: &RecordBatch, file: &Path) -> Result<Self, TraceError> {
        let u64c = |n: &str| prim::<UInt64Type>(column(batch, n, file)?.as_ref(), n, file);
        let u32c = |n: &str| prim::<UInt32Type>(column(batch, n, file)?.as_ref(), n, file);
        let blocks = list(
            column(batch, "prompt_blocks", file)?.as_ref(),
            "prompt_blocks",
            file,
        )?;
        let block_values =
            prim::<UInt64Type>(blocks.values().as_ref(), "prompt_blocks.item", file)?;
        let images = list(column(batch, "images", file)?.as_ref(), "images", file)?;
        let st = images.values().as_struct_opt().cloned().ok_or_else(|| {
            TraceError::invalid(
                file,
                Location::File,
                "images.item",
                format!(
                    "has type {}, expected a struct",
                    images.values().data_type()
                ),
            )
        })?;
        let sf = |n: &str| -> Result<&ArrayRef, TraceError> {
            st.column_by_name(n).ok_or_else(|| {
                TraceError::invalid(
                    file,
                    Location::File,
                    format!("images.{n}"),
                    "missing; expected it in the image struct",
                )
            })
        };
        let s32 = |n: &str| prim::<UInt32Type>(sf(n)?.as_ref(), &format!("images.{n}"), file);
        let fork_tokens = list(
            column(batch, "fork_output_tokens", file)?.as_ref(),
            "fork_output_tokens",
            file,
        )?;
        let fork_values = prim::<UInt32Type>(
            fork_tokens.values().as_ref(),
            "fork_output_tokens.item",
            file,
        )?;
        Ok(Self {
            rows: batch.num_rows(),
            id: u64c("id")?,
            arrival_ns: u64c("arrival_ns")?,
            session: u64c("session")?,
            turn: u32c("turn")?,
            tenant: u32c("tenant")?,
            prompt_tokens: u32c("prompt_tokens")?,
            img_content: prim::<UInt64Type>(sf("content_id")?.as_ref(), "images.content_id", file)?,
            img_width: s32("width")?,
            img_height: s32("height")?,
            img_tokens: s32("visual_tokens")?,
            img_grid: [s32("grid_t")?, s32("grid_h")?, s32("grid_w")?],
            output_tokens: u32c("output_tokens")?,
            fork_branches: u32c("fork_branches")?,
            blocks,
            block_values,
            images,
            fork_tokens,
            fork_values,
        })
    }

    /// Decode row `i`; `Err((field, problem))` on a null in a required column.
    fn row(&self, i: usize) -> Result<Request, (String, String)> {
        fn req<T: arrow_array::ArrowPrimitiveType>(
            a: &PrimitiveArray<T>,
            i: usize,
            name: impl FnOnce() -> String,
        ) -> Result<T::Native, (String, String)> {
            if a.is_null(i) {
                Err((name(), "null; expected a value".to_string()))
            } else {
                Ok(a.value(i))
            }
        }
        fn opt<T: arrow_array::ArrowPrimitiveType>(
            a: &PrimitiveArray<T>,
            i: usize,
        ) -> Option<T::Native> {
            if a.is_null(i) {
                None
            } else {
                Some(a.value(i))
            }
        }
        for (name, l) in [("prompt_blocks", &self.blocks), ("images", &self.images)] {
            if l.is_null(i) {
                return Err((
                    name.to_string(),
                    "null; expected a (possibly empty) list".to_string(),
                ));
            }
        }
        let range = |l: &ListArray| {
            let o = l.value_offsets();
            (o[i] as usize, o[i + 1] as usize)
        };
        let (b0, b1) = range(&self.blocks);
        if b1 > self.block_values.len() || b0 > b1 {
            return Err(("prompt_blocks".into(), "list offsets out of range".into()));
        }
        if self.block_values.null_count() > 0 && (b0..b1).any(|k| self.block_values.is_null(k)) {
            return Err(("prompt_blocks".into(), "null block id; expected u64".into()));
        }
        let prompt_blocks = self.block_values.values()[b0..b1].to_vec();
        let (i0, i1) = range(&self.images);
        if i1 > self.img_content.len() || i0 > i1 {
            return Err(("images".into(), "list offsets out of range".into()));
        }
        let mut images = Vec::with_capacity(i1 - i0);
        for k in i0..i1 {
            let j = k - i0;
            let grid = match (
                opt(&self.img_grid[0], k),
                opt(&self.img_grid[1], k),
                opt(&self.img_grid[2], k),
            ) {
                (Some(t), Some(h), Some(w)) => Some([t, h, w]),
                (None, None, None) => None,
                _ => {
                    return Err((
                        format!("images[{j}].grid_thw"),
                        "partly null; expected grid_t, grid_h, grid_w all set or all null".into(),
                    ))
                }
            };
            images.push(Image {
                content_id: req(&self.img_content, k, || format!("images[{j}].content_id"))?,
                width: opt(&self.img_width, k),
                height: opt(&self.img_height, k),
                visual_tokens: req(&self.img_tokens, k, || format!("images[{j}].visual_tokens"))?,
                grid_thw: grid,
            });
        }
        let fork = match (opt(&self.fork_branches, i), self.fork_tokens.is_null(i)) {
            (Some(branches), false) => {
                let (f0, f1) = range(&self.fork_tokens);
                if f1 > self.fork_values.len() || f0 > f1 {
                    return Err((
                        "fork_output_tokens".into(),
                        "list offsets out of range".into(),
                    ));
                }
                if self.fork_values.null_count() > 0
                    && (f0..f1).any(|k| self.fork_values.is_null(k))
                {
                    return Err((
                        "fork_output_tokens".into(),
                        "null entry; expected u32".into(),
                    ));
                }
                Some(Fork {
                    branches,
                    output_tokens: self.fork_values.values()[f0..f1].to_vec(),
                })
            }
            (None, true) => None,
            _ => {
                return Err((
                    "fork_branches".into(),
                    "fork_branches and fork_output_tokens must both be null or both be set".into(),
                ))
            }
        };
        Ok(Request {
            id: req(&self.id, i, || "id".to_string())?,
            arrival_ns: req(&self.arrival_ns, i, || "arrival_ns".to_string())?,
            session: req(&self.session, i, || "session".to_string())?,
            turn: req(&self.turn, i, || "turn".to_string())?,
            tenant: req(&self.tenant, i, || "tenant".to_string())?,
            prompt_tokens: req(&self.prompt_tokens, i, || "prompt_tokens".to_string())?,
            prompt_blocks,
            images,
            output_tokens: req(&self.output_tokens, i, || "output_tokens".to_string())?,
            fork,
        })
    }
}

/// Streaming Parquet trace reader.
pub struct ParquetReader {
    inner: Option<ParquetRecordBatchReader>,
    file: PathBuf,
    header: TraceHeader,
    validator: Validator,
    view: Option<BatchView>,
    pos: usize,
    row: u64,
    done: bool,
}

thread_local! {
    /// Set while this thread runs the Parquet decoder under [`quietly`].
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Run `f` (third-party decoding of untrusted bytes), turning a panic into `Err` without
/// the panic hook printing it: a corrupt file is an error the reader returns naming the
/// file, and nothing else may appear on stderr. Validating every page up front would mean
/// reimplementing the decoder, so this is the last resort, kept narrow: a hook installed
/// once per process stays silent only on a thread inside `quietly` and hands every other
/// panic (a failing test, a bug elsewhere) to the hook that was there before.
fn quietly<R>(f: impl FnOnce() -> R) -> std::thread::Result<R> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(std::cell::Cell::get) {
                prev(info);
            }
        }));
    });
    let was = QUIET.with(|q| q.replace(true));
    let r = catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    r
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "decoder panicked".to_string()
    }
}

impl ParquetReader {
    /// Open a Parquet trace file and read its header from the footer.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        let path = path.as_ref();
        let f = File::open(path).map_err(|e| TraceError::io(path, e))?;
        Self::from_chunks(f, path)
    }

    /// Read a Parquet trace held in memory; `file` names it in errors.
    pub fn from_bytes(bytes: Vec<u8>, file: impl AsRef<Path>) -> Result<Self, TraceError> {
        Self::from_chunks(bytes::Bytes::from(bytes), file.as_ref())
    }

    fn from_chunks<T: ChunkReader + 'static>(input: T, file: &Path) -> Result<Self, TraceError> {
        // The decoder is third-party code fed untrusted bytes: a panic inside it becomes an
        // error naming the file rather than taking the process down.
        let built = quietly(|| {
            let b = ParquetRecordBatchReaderBuilder::try_new(input)?;
            let kv = b
                .metadata()
                .file_metadata()
                .key_value_metadata()
                .and_then(|kv| kv.iter().find(|k| k.key == HEADER_KEY))
                .and_then(|k| k.value.clone());
            let schema = b.schema().clone();
            let reader = b.with_batch_size(BATCH_ROWS).build()?;
            Ok::<_, parquet::errors::ParquetError>((kv, schema, reader))
        });
        let (kv, schema, reader) = match built {
            Ok(Ok(x)) => x,
            Ok(Err(e)) => {
                return Err(TraceError::invalid(
                    file,
                    Location::File,
                    "(parquet)",
                    format!("{e}; expected a Parquet trace file"),
                ))
            }
            Err(p) => {
                return Err(TraceError::invalid(
                    file,
                    Location::File,
                    "(parquet)",
                    format!("corrupt file ({})", panic_message(p.as_ref())),
                ))
            }
        };
        let Some(text) = kv else {
            return Err(TraceError::invalid(
                file,
                Location::File,
                "header",
                format!("no `{HEADER_KEY}` key-value metadata; expected a moonagent trace header"),
            ));
        };
        let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            TraceError::invalid(
                file,
                Location::File,
                "header",
                format!("{e}; expected a JSON header"),
            )
        })?;
        match value.get("schema_version").and_then(|v| v.as_u64()) {
            Some(v) if v == u64::from(SCHEMA_VERSION) => {}
            other => {
                return Err(TraceError::invalid(
                    file,
                    Location::File,
                    "header.schema_version",
                    format!(
                        "unknown schema version {}, expected {SCHEMA_VERSION}",
                        other
                            .map(|v| v.to_string())
                            .unwrap_or_else(|| "(missing)".into())
                    ),
                ))
            }
        }
        let header: TraceHeader = crate::jsonl::parse_line(text.as_bytes()).map_err(|e| {
            TraceError::invalid(
                file,
                Location::File,
                format!("header.{}", e.field),
                e.problem,
            )
        })?;
        header.check().map_err(|e| e.at(file, Location::File))?;
        check_schema(&schema, file)?;
        Ok(Self {
            inner: Some(reader),
            file: file.to_path_buf(),
            validator: Validator::new(&header),
            header,
            view: None,
            pos: 0,
            row: 0,
            done: false,
        })
    }

    /// The trace header.
    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    /// The file name used in errors.
    pub fn path(&self) -> &Path {
        &self.file
    }

    fn next_inner(&mut self) -> Result<Option<Request>, TraceError> {
        loop {
            if let Some(v) = &self.view {
                if self.pos < v.rows {
                    let i = self.pos;
                    self.pos += 1;
                    self.row += 1;
                    let at = Location::Row(self.row);
                    let req = v
                        .row(i)
                        .map_err(|(f, p)| TraceError::invalid(&self.file, at, f, p))?;
                    self.validator
                        .check(&req)
                        .map_err(|e| e.at(&self.file, at))?;
                    return Ok(Some(req));
                }
            }
            self.view = None;
            let Some(reader) = self.inner.as_mut() else {
                return Ok(None);
            };
            let next = quietly(|| reader.next());
            let at = Location::Row(self.row + 1);
            match next {
                Ok(None) => return Ok(None),
                Ok(Some(Ok(batch))) => {
                    self.view = Some(BatchView::new(&batch, &self.file)?);
                    self.pos = 0;
                }
                Ok(Some(Err(e))) => {
                    return Err(TraceError::invalid(
                        &self.file,
                        at,
                        "(parquet)",
                        format!("{e}; expected a readable row group"),
                    ))
                }
                Err(p) => {
                    self.inner = None;
                    return Err(TraceError::invalid(
                        &self.file,
                        at,
                        "(parquet)",
                        format!("corrupt data ({})", panic_message(p.as_ref())),
                    ));
                }
            }
        }
    }
}

/// Check the column types once, so a foreign file fails with the column's name.
fn check_schema(schema: &Schema, file: &Path) -> Result<(), TraceError> {
    let want = arrow_schema();
    for f in want.fields() {
        let Ok(got) = schema.field_with_name(f.name()) else {
            return Err(TraceError::invalid(
                file,
                Location::File,
                f.name(),
                format!("column missing; expected {}", f.data_type()),
            ));
        };
        if !same_shape(got.data_type(), f.data_type()) {
            return Err(TraceError::invalid(
                file,
                Location::File,
                f.name(),
                format!(
                    "column has type {}, expected {}",
                    got.data_type(),
                    f.data_type()
                ),
            ));
        }
    }
    Ok(())
}

/// Types equal up to nullability and list item names (other writers name items differently).
fn same_shape(a: &DataType, b: &DataType) -> bool {
    match (a, b) {
        (DataType::List(x), DataType::List(y)) => same_shape(x.data_type(), y.data_type()),
        (DataType::Struct(x), DataType::Struct(y)) => y.iter().all(|fy| {
            x.iter()
                .find(|fx| fx.name() == fy.name())
                .is_some_and(|fx| same_shape(fx.data_type(), fy.data_type()))
        }),
        _ => a == b,
    }
}

impl Iterator for ParquetReader {
    type Item = Result<Request, TraceError>;

    /// The next request; after the first error the stream ends.
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let step = self.next_inner();
        crate::end_on_error(&mut self.done, step)
    }
}
