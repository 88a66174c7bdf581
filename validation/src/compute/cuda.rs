//! `CudaCompute` (feature `cuda`): the [`CpuCompute`] operator sequence with every dense
//! layer's GEMM run by cuBLAS (sgemm) on an NVIDIA GPU.
//!
//! The weights of every dense layer are uploaded once and stay in device memory; each GEMM
//! uploads its activations, runs `cublasSgemm` and reads the result back, on a stream and
//! cuBLAS handle of the calling worker's own (so encoder, prefill and decode workers run
//! their GEMMs concurrently, as a server's streams do, not one at a time). Norms,
//! activations, RoPE and attention run on the host with the CPU backend's code, and KV
//! pages stay in a host [`KvArena`] (device-resident KV and attention kernels are not
//! built yet). cudarc loads the driver and cuBLAS at run time (`dynamic-loading`), so the
//! feature builds on a machine without CUDA; [`CudaCompute::new`] then fails with
//! [`ComputeError::NoDevice`]. `tests/compute_cuda.rs` checks that error path here and,
//! on a GPU, the results against the CPU backend's (an H200 ran `validate` through this
//! on 2026-12-04: `validation/reports/`).

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use moonagent_models::ModelSpec;

use super::cpu::CpuCompute;
use super::kv::KvArena;
use super::ops::{Linear, LinearExec};
use super::{Compute, ComputeError, DecodeSeq, ImageInput, PrefillChunk};

/// Largest model the CUDA backend builds: 2^34 parameters (64 GiB of f32 weights on the
/// host and again on the device), room for Qwen2.5-VL-7B's 8.3 G.
const MAX_PARAMS: u64 = 1 << 34;

/// One caller's stream and cuBLAS handle: GEMMs issued through a lane run in the order
/// issued, lanes run concurrently on the device.
struct Lane {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
}

/// cuBLAS GEMMs. Each concurrent caller (the backend's encoder, prefill and decode worker
/// threads) takes a lane of its own from the pool, so their GEMMs are not serialized in
/// this process: the GPU arbitrates between them as it does between a real server's
/// streams. Weights live once in device memory, read by every lane.
struct CudaExec {
    ctx: Arc<CudaContext>,
    /// Device copy of each dense layer's weights, keyed by the host weights' address
    /// (the model is immutable once built, so the address identifies the layer); uploaded
    /// and synchronized before any lane reads them.
    weights: HashMap<usize, CudaSlice<f32>>,
    /// Idle lanes; a caller that finds none makes one.
    lanes: Mutex<Vec<Lane>>,
}

fn device_err(e: impl std::fmt::Display) -> ComputeError {
    ComputeError::Device(e.to_string())
}

fn to_int(v: usize) -> Result<i32, ComputeError> {
    i32::try_from(v).map_err(|_| ComputeError::TooLarge {
        what: "GEMM dimension",
    })
}

impl CudaExec {
    fn new_lane(ctx: &Arc<CudaContext>) -> Result<Lane, ComputeError> {
        let stream = ctx.new_stream().map_err(device_err)?;
        let blas = CudaBlas::new(stream.clone()).map_err(device_err)?;
        Ok(Lane { stream, blas })
    }

    fn take_lane(&self) -> Result<Lane, ComputeError> {
        let idle = self
            .lanes
            .lock()
            .map_err(|_| ComputeError::Device("a previous GEMM panicked".into()))?
            .pop();
        match idle {
            Some(lane) => Ok(lane),
            None => Self::new_lane(&self.ctx),
        }
    }

    fn put_lane(&self, lane: Lane) {
        if let Ok(mut lanes) = self.lanes.lock() {
            lanes.push(lane);
        }
    }

    fn gemm_on(
        &self,
        lane: &Lane,
        w: &CudaSlice<f32>,
        x: &[f32],
        rows: usize,
        din: usize,
        dout: usize,
    ) -> Result<Vec<f32>, ComputeError> {
        let dx = lane.stream.clone_htod(x).map_err(device_err)?;
        let mut dy = lane
            .stream
            .alloc_zeros::<f32>(rows * dout)
            .map_err(device_err)?;
        // Row-major Y (rows x dout) = X (rows x din) W (din x dout) is, column-major,
        // Y^T (dout x rows) = W^T (dout x din) X^T (din x rows): the buffers as they are.
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_N,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: to_int(dout)?,
            n: to_int(rows)?,
            k: to_int(din)?,
            alpha: 1.0f32,
            lda: to_int(dout)?,
            ldb: to_int(din)?,
            beta: 0.0f32,
            ldc: to_int(dout)?,
        };
        // SAFETY: `w` holds din*dout values (uploaded from the layer), `dx` rows*din and
        // `dy` rows*dout; the leading dimensions above are those of these buffers.
        unsafe { lane.blas.gemm(cfg, w, &dx, &mut dy) }.map_err(device_err)?;
        let y = lane.stream.clone_dtoh(&dy).map_err(device_err)?;
        lane.stream.synchronize().map_err(device_err)?;
        Ok(y)
    }
}

impl LinearExec for CudaExec {
    fn linear(&self, layer: &Linear, x: &[f32], rows: usize) -> Result<Vec<f32>, ComputeError> {
        let (din, dout) = (layer.din, layer.dout);
        if rows == 0 {
            return Ok(Vec::new());
        }
        let n_in = rows.checked_mul(din).filter(|n| *n <= x.len());
        let n_in = n_in.ok_or(ComputeError::TooLarge { what: "GEMM input" })?;
        let w = self
            .weights
            .get(&(layer.weights().as_ptr() as usize))
            .ok_or_else(|| ComputeError::Device("a layer without device weights".into()))?;
        let lane = self.take_lane()?;
        // A lane whose GEMM failed is dropped (by `?`), not reused.
        let mut y = self.gemm_on(&lane, w, &x[..n_in], rows, din, dout)?;
        self.put_lane(lane);
        layer.add_bias(&mut y);
        Ok(y)
    }
}

/// [`Compute`] with cuBLAS GEMMs on GPU `ordinal`; otherwise the CPU backend's operators
/// (see the module docs). Outputs equal the CPU backend's up to GEMM rounding.
pub struct CudaCompute {
    model: CpuCompute,
    exec: CudaExec,
}

impl std::fmt::Debug for CudaCompute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaCompute")
            .field("model", &self.model.spec().name)
            .finish_non_exhaustive()
    }
}

/// Run `f`, turning a panic (cudarc panics when a library cannot be loaded) into an error.
fn no_panic<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, ComputeError> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("panic");
        ComputeError::NoDevice(format!("{what}: {msg}"))
    })
}

impl CudaCompute {
    /// Build `spec` (weights as [`CpuCompute::new`] draws them under `seed`) on GPU
    /// `ordinal`. Without an NVIDIA driver, cuBLAS or a device this returns
    /// [`ComputeError::NoDevice`], never panics.
    pub fn new(spec: &ModelSpec, seed: u64, ordinal: usize) -> Result<Self, ComputeError> {
        let model =
            CpuCompute::with_max_params(spec, seed, MAX_PARAMS)?.with_parallel_attention(true);
        // SAFETY: probing loads the shared library by name, as cudarc itself does.
        if !no_panic("loading libcuda", || unsafe {
            cudarc::driver::sys::is_culib_present()
        })? {
            return Err(ComputeError::NoDevice(
                "the CUDA driver library (libcuda) is not installed: no NVIDIA driver here".into(),
            ));
        }
        // SAFETY: as above.
        if !no_panic("loading cuBLAS", || unsafe {
            cudarc::cublas::sys::is_culib_present()
        })? {
            return Err(ComputeError::NoDevice(
                "the cuBLAS library (libcublas) is not installed".into(),
            ));
        }
        let ctx = no_panic("opening the CUDA device", || CudaContext::new(ordinal))?
            .map_err(|e| ComputeError::NoDevice(format!("GPU {ordinal}: {e}")))?;
        let lane = no_panic("creating a cuBLAS handle", || CudaExec::new_lane(&ctx))?
            .map_err(|e| ComputeError::NoDevice(format!("cuBLAS on GPU {ordinal}: {e}")))?;
        let mut weights = HashMap::new();
        for l in model.linears() {
            let w = lane.stream.clone_htod(l.weights()).map_err(device_err)?;
            weights.insert(l.weights().as_ptr() as usize, w);
        }
        lane.stream.synchronize().map_err(device_err)?;
        Ok(Self {
            model,
            exec: CudaExec {
                ctx,
                weights,
                lanes: Mutex::new(vec![lane]),
            },
        })
    }
}

impl Compute for CudaCompute {
    type Kv = KvArena;

    fn spec(&self) -> &ModelSpec {
        self.model.spec()
    }

    fn new_kv(&self, pages: u32, page_tokens: u32) -> Result<KvArena, ComputeError> {
        self.model.new_kv(pages, page_tokens)
    }

    fn encode(&self, images: &[ImageInput]) -> Result<Vec<Vec<u8>>, ComputeError> {
        self.model.encode_with(&self.exec, images)
    }

    fn prefill(
        &self,
        kv: &mut KvArena,
        chunks: &[PrefillChunk<'_>],
    ) -> Result<Vec<u32>, ComputeError> {
        self.model.prefill_with(&self.exec, kv, chunks)
    }

    fn decode(&self, kv: &mut KvArena, batch: &[DecodeSeq<'_>]) -> Result<Vec<u32>, ComputeError> {
        self.model.decode_with(&self.exec, kv, batch)
    }

    fn copy_pages(&self, kv: &mut KvArena, src: &[u32], dst: &[u32]) -> Result<(), ComputeError> {
        CpuCompute::copy_pages_host(kv, src, dst)
    }
}
