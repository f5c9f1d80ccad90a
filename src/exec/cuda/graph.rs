//! The step as one CUDA Graph. The executor captures a whole step's work (every
//! micro-step's input copies, kernels, library calls, copies between the tiers and host
//! steps) from its compute stream into a graph and launches it at once: the device runs
//! the step without waiting for the host between launches, and the host synchronizes once
//! per step.
//!
//! Kernels take the step number and dropout stream as arguments, so a step's graph is
//! captured for its [`CaptureKey`]. The executor captures the next step's graph while the
//! device runs the current one, and the executable graph is updated in place
//! (`cuGraphExecUpdate`: same topology, new arguments) rather than instantiated again.

use super::device_error;
use crate::exec::ExecError;
use cudarc::driver::{result, sys, CudaStream};
use std::sync::Arc;

/// How the CUDA executor issues a step's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepMode {
    /// Captured as one CUDA Graph and launched at once (the default).
    Graph,
    /// Launch by launch on the stream (`MEMC_CUDA_GRAPH=0`).
    Launches,
    /// Launch by launch, waiting for each step of the plan and naming the first that fails
    /// (`MEMC_CUDA_SYNC=1`, which wins over `MEMC_CUDA_GRAPH`).
    Synchronized,
}

impl StepMode {
    /// The mode the environment variables' values ask for.
    pub fn from_vars(sync: Option<&std::ffi::OsStr>, graph: Option<&std::ffi::OsStr>) -> StepMode {
        match (sync, graph) {
            (Some(v), _) if v == "1" => StepMode::Synchronized,
            (_, Some(v)) if v == "0" => StepMode::Launches,
            _ => StepMode::Graph,
        }
    }

    /// The mode `MEMC_CUDA_SYNC` and `MEMC_CUDA_GRAPH` ask for.
    pub fn from_env() -> StepMode {
        let (sync, graph) = (
            std::env::var_os("MEMC_CUDA_SYNC"),
            std::env::var_os("MEMC_CUDA_GRAPH"),
        );
        StepMode::from_vars(sync.as_deref(), graph.as_deref())
    }
}

impl super::CudaExecutor {
    /// Runs step `number` as a graph: the one captured ahead for it, else captured now;
    /// then captures the next step's while the device runs this one (a capture ahead that
    /// fails is captured again, and reported, by the next step).
    pub(super) fn run_graph(&mut self, number: u64) -> Result<(), ExecError> {
        let graph = match self.graph.take_ahead(self.capture_key(number)) {
            Some(graph) => graph,
            None => self.capture_step(number)?,
        };
        self.graph.launch(graph, &self.stream)?;
        if let Ok(next) = self.capture_step(number + 1) {
            let key = self.capture_key(number + 1);
            self.graph.keep_ahead(key, next);
        }
        Ok(())
    }

    /// What a graph of step `number` is captured for.
    fn capture_key(&self, number: u64) -> CaptureKey {
        CaptureKey {
            step: number,
            seed: self.seed,
            bound: self.bound.1,
        }
    }

    /// Step `number`'s work captured as a graph.
    fn capture_step(&mut self, number: u64) -> Result<Captured, ExecError> {
        let stream = Arc::clone(&self.stream);
        capture(&stream, || self.issue_step(number, &mut None))
    }
}

/// What a captured step depends on besides the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CaptureKey {
    /// The step number its kernels were given.
    pub(super) step: u64,
    /// The run's seed, which keys the dropout streams.
    pub(super) seed: u64,
    /// How many times inputs were bound before it was captured: binding one moves the
    /// page-locked bytes its copies read.
    pub(super) bound: u64,
}

/// A captured graph, destroyed when dropped.
pub(super) struct Captured(sys::CUgraph);

// SAFETY: the graph is owned by this value alone and used from one thread at a time.
unsafe impl Send for Captured {}

impl Drop for Captured {
    fn drop(&mut self) {
        // SAFETY: the graph came from `end_capture` and is destroyed once; an executable
        // graph instantiated or updated from it does not refer to it.
        let _ = unsafe { result::graph::destroy(self.0) };
    }
}

/// Captures what `issue` issues on `stream` (and on the streams it joins) as a graph.
/// The capture ends whether or not `issue` fails; its failure is the error.
pub(super) fn capture(
    stream: &CudaStream,
    issue: impl FnOnce() -> Result<(), ExecError>,
) -> Result<Captured, ExecError> {
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    stream.begin_capture(mode).map_err(device_error)?;
    let issued = issue();
    // SAFETY: the stream is capturing (begun above) and is not the legacy default stream.
    let ended = unsafe { result::stream::end_capture(stream.cu_stream()) };
    let graph = ended.map(|g| (!g.is_null()).then_some(Captured(g)));
    issued?;
    graph
        .map_err(device_error)?
        .ok_or_else(|| ExecError::Device("CUDA graph capture captured no graph".to_string()))
}

/// The executable graph of the step and the graph captured ahead for the next.
#[derive(Default)]
pub(super) struct StepGraph {
    exec: Option<Exec>,
    ahead: Option<(CaptureKey, Captured)>,
}

/// An executable graph, destroyed when dropped.
struct Exec(sys::CUgraphExec);

// SAFETY: as for `Captured`.
unsafe impl Send for Exec {}

impl Drop for Exec {
    fn drop(&mut self) {
        // SAFETY: instantiated once by `StepGraph::launch`, destroyed once; the executor
        // synchronizes its stream at every step's end, so no launch of it is in flight.
        let _ = unsafe { result::graph::exec_destroy(self.0) };
    }
}

impl StepGraph {
    /// The graph captured ahead for `key`, if one was; one captured for another key (the
    /// seed, the step number or the bound inputs changed since) is dropped.
    pub(super) fn take_ahead(&mut self, key: CaptureKey) -> Option<Captured> {
        match self.ahead.take() {
            Some((k, graph)) if k == key => Some(graph),
            _ => None,
        }
    }

    /// Keeps `graph`, captured for `key`, for the step that will ask for it.
    pub(super) fn keep_ahead(&mut self, key: CaptureKey, graph: Captured) {
        self.ahead = Some((key, graph));
    }

    /// Launches `graph` on `stream`: the executable graph is updated to it where only
    /// arguments changed, and instantiated from it otherwise (the first step, or a
    /// topology the driver cannot update to).
    pub(super) fn launch(&mut self, graph: Captured, stream: &CudaStream) -> Result<(), ExecError> {
        let updated = match &self.exec {
            Some(exec) => {
                let mut info = sys::CUgraphExecUpdateResultInfo {
                    result: sys::CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS,
                    errorNode: std::ptr::null_mut(),
                    errorFromNode: std::ptr::null_mut(),
                };
                // SAFETY: both handles are live; the executable graph is not running (the
                // stream was synchronized at the previous step's end).
                let status = unsafe { sys::cuGraphExecUpdate_v2(exec.0, graph.0, &mut info) };
                status == sys::CUresult::CUDA_SUCCESS
            }
            None => false,
        };
        if !updated {
            self.exec = None;
            let flags = sys::CUgraphInstantiate_flags(0);
            // SAFETY: `graph` is a complete captured graph.
            let exec =
                unsafe { result::graph::instantiate(graph.0, flags) }.map_err(device_error)?;
            self.exec = Some(Exec(exec));
        }
        let exec = self.exec.as_ref().map(|e| e.0);
        let exec = exec.ok_or_else(|| ExecError::Device("no executable graph".to_string()))?;
        // SAFETY: the executable graph is live and its work addresses the executor's
        // arena, host arena and page-locked bytes, which outlive the step.
        unsafe { result::graph::launch(exec, stream.cu_stream()) }.map_err(device_error)
    }
}

#[cfg(test)]
mod tests {
    use super::StepMode;
    use std::ffi::OsStr;

    #[test]
    fn the_environment_picks_the_step_mode() {
        let (one, zero) = (Some(OsStr::new("1")), Some(OsStr::new("0")));
        assert_eq!(StepMode::from_vars(None, None), StepMode::Graph);
        assert_eq!(StepMode::from_vars(None, one), StepMode::Graph);
        assert_eq!(StepMode::from_vars(zero, None), StepMode::Graph);
        assert_eq!(StepMode::from_vars(None, zero), StepMode::Launches);
        assert_eq!(StepMode::from_vars(one, zero), StepMode::Synchronized);
        assert_eq!(StepMode::from_vars(one, None), StepMode::Synchronized);
    }
}
