//! CUDA graphs for plan replay ([`kiln_device::graph`]), the device's [`GraphFactory`]
//! ([`CudaGraphs`]): a plan's launches become one
//! graph, built explicitly as a chain of kernel nodes (each depends on the one before, so
//! they run in capture order), instantiated once and launched with one `cuGraphLaunch` per
//! run on the calling thread's default stream, followed by an event that a timeline signal
//! of the graph's own waits on (with the plan's timeout). New variable values update the nodes in
//! place (`cuGraphExecKernelNodeSetParams`); a launch the driver refuses to update makes the
//! plan capture again.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::sys;
use kiln_device::{GraphFactory, GraphLaunch, LaunchGraph, Program, Result, TimelineSignal};

use crate::program::{Arguments, CudaProgram};
use crate::signal::{CudaEvent, CudaSignal};
use crate::{CudaDevice, PER_THREAD_STREAM, driver};

/// The CUDA program behind each launch, if every launch is a CUDA program of `cu`.
fn cuda_programs<'a>(cu: &Arc<CudaDevice>, launches: &'a [GraphLaunch]) -> Option<Vec<&'a CudaProgram>> {
    launches
        .iter()
        .map(|l| (l.program.as_ref() as &dyn std::any::Any).downcast_ref::<CudaProgram>())
        .map(|p| p.filter(|p| Arc::ptr_eq(p.device(), cu)))
        .collect()
}

/// Checked arguments of every launch.
fn arguments(programs: &[&CudaProgram], launches: &[GraphLaunch]) -> Result<Vec<Arguments>> {
    programs.iter().zip(launches).map(|(p, l)| p.arguments(&l.views, &l.vals, &l.dims)).collect()
}

fn check(what: &str, status: sys::CUresult) -> Result<()> {
    status.result().map_err(|e| driver(what, e))
}

/// The launch graphs of one CUDA device (a part of the device: [`kiln_device::DeviceParts`]).
pub struct CudaGraphs {
    cu: Arc<CudaDevice>,
}

impl CudaGraphs {
    /// The graph factory of `cu`.
    pub(crate) fn new(cu: Arc<CudaDevice>) -> CudaGraphs {
        CudaGraphs { cu }
    }
}

impl GraphFactory for CudaGraphs {
    fn capture(&self, launches: &[GraphLaunch]) -> Result<Option<Box<dyn LaunchGraph>>> {
        Ok(CudaGraph::capture(&self.cu, launches)?.map(|g| Box::new(g) as Box<dyn LaunchGraph>))
    }
}

/// An instantiated graph of one plan's launches on one device.
pub struct CudaGraph {
    cu: Arc<CudaDevice>,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    nodes: Vec<sys::CUgraphNode>,
    /// The programs of the nodes, in order: their modules must outlive the graph.
    programs: Vec<Arc<dyn Program>>,
    /// Reaches `n` when the `n`th launch finished.
    done: CudaSignal,
    launched: u64,
}

// SAFETY: the graph handles are driver objects used only through `&mut self` (one thread
// at a time), each use first making the device's context current.
unsafe impl Send for CudaGraph {}

impl CudaGraph {
    /// Builds and instantiates the graph of `launches` (CUDA programs of `cu`); `Ok(None)`
    /// when a launch is not one.
    pub(crate) fn capture(cu: &Arc<CudaDevice>, launches: &[GraphLaunch]) -> Result<Option<CudaGraph>> {
        let Some(programs) = cuda_programs(cu, launches) else { return Ok(None) };
        let mut args = arguments(&programs, launches)?;
        cu.bind()?;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: `graph` is a valid out-pointer; flags must be 0.
        check("cuGraphCreate", unsafe { sys::cuGraphCreate(&mut graph, 0) })?;
        let mut built = CudaGraph {
            cu: cu.clone(),
            graph,
            exec: std::ptr::null_mut(),
            nodes: Vec::with_capacity(launches.len()),
            programs: launches.iter().map(|l| l.program.clone()).collect(),
            done: CudaSignal::default(),
            launched: 0,
        };
        for a in &mut args {
            let params = a.node_params();
            let mut node: sys::CUgraphNode = std::ptr::null_mut();
            let (deps, ndeps) = match built.nodes.last() {
                Some(prev) => (prev as *const sys::CUgraphNode, 1),
                None => (std::ptr::null(), 0),
            };
            // SAFETY: `graph` is live; `deps` points at `ndeps` nodes of it; `params` points
            // at argument slots that `a` keeps alive during the call (the driver copies them).
            check("cuGraphAddKernelNode", unsafe {
                sys::cuGraphAddKernelNode_v2(&mut node, graph, deps, ndeps, &params)
            })?;
            built.nodes.push(node);
        }
        // SAFETY: `graph` is complete; `exec` is a valid out-pointer.
        check("cuGraphInstantiate", unsafe { sys::cuGraphInstantiateWithFlags(&mut built.exec, graph, 0) })?;
        Ok(Some(built))
    }
}

impl LaunchGraph for CudaGraph {
    fn update(&mut self, launches: &[GraphLaunch]) -> Result<bool> {
        let same = launches.len() == self.programs.len()
            && launches.iter().zip(&self.programs).all(|(l, p)| Arc::ptr_eq(&l.program, p));
        let Some(programs) = cuda_programs(&self.cu, launches).filter(|_| same) else { return Ok(false) };
        let mut args = arguments(&programs, launches)?;
        self.cu.bind()?;
        for (node, a) in self.nodes.iter().zip(&mut args) {
            let params = a.node_params();
            // SAFETY: `exec` was instantiated from the graph that holds `node`; `params`
            // points at slots `a` keeps alive during the call (the driver copies them).
            let status = unsafe { sys::cuGraphExecKernelNodeSetParams_v2(self.exec, *node, &params) };
            if status != sys::CUresult::CUDA_SUCCESS {
                return Ok(false);
            }
        }
        Ok(true)
    }

    unsafe fn launch(&mut self) -> Result<()> {
        self.cu.bind()?;
        // SAFETY: `exec` is live; the caller guarantees every node's arguments (this
        // function's contract); the per-thread stream is valid in the current context.
        check("cuGraphLaunch", unsafe { sys::cuGraphLaunch(self.exec, PER_THREAD_STREAM) })?;
        let event = CudaEvent::record(&self.cu, PER_THREAD_STREAM, false)?;
        self.launched += 1;
        self.done.record(self.launched, event)
    }

    fn wait(&mut self, timeout: Duration) -> Result<()> {
        self.done.wait(self.launched, timeout)
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        if self.cu.bind().is_ok() {
            // SAFETY: each handle was created by `capture` and is destroyed once, here; a
            // null `exec` (instantiation failed) is skipped.
            unsafe {
                if !self.exec.is_null() {
                    let _ = sys::cuGraphExecDestroy(self.exec);
                }
                let _ = sys::cuGraphDestroy(self.graph);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use kiln_device::kiln_ir::{KernelBuilder, Scalar};
    use kiln_device::{Buffer, Kernel};

    use super::*;

    /// `y[i] = x[i] * 2 + 1` for `i < n`.
    fn affine(dev: &kiln_device::Device) -> Kernel {
        let mut k = KernelBuilder::new();
        let n = k.var("n", 1, 1 << 20);
        let (x, y) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n));
        let i = k.global(0, &n);
        k.store(&y.at(&i), &(x.at(&i).load() * 2.0f32 + 1.0f32));
        dev.compile(&k.finish().unwrap(), Some("graph_affine")).unwrap()
    }

    fn launches(k: &Kernel, pairs: &[(&Buffer, &Buffer)], n: i64) -> Vec<GraphLaunch> {
        pairs
            .iter()
            .map(|(x, y)| {
                let (views, dims) = k.check(&[x, y], &[n]).unwrap();
                GraphLaunch { program: k.program().clone(), views, vals: vec![n], dims }
            })
            .collect()
    }

    /// Two chained launches captured as one graph, launched, then updated to a larger `n`
    /// and launched again (runs on CUDA:0; skipped without it, fails with KILN_REQUIRE=cuda).
    #[test]
    fn a_captured_chain_runs_in_order_and_updates_in_place() {
        let Some(dev) = crate::test_device() else { return };
        let k = affine(&dev);
        let buf = |v: &[f32]| Buffer::from_slice(dev.allocator(), v).unwrap();
        let xs: Vec<f32> = (0..1024).map(|i| i as f32).collect();
        let (a, b, c) = (buf(&xs), buf(&[0f32; 1024]), buf(&[-1f32; 1024]));
        let first = launches(&k, &[(&a, &b), (&b, &c)], 256);
        let graphs = k.graphs().expect("a CUDA device has graphs");
        let mut graph = graphs.capture(&first).unwrap().expect("CUDA programs capture a graph");
        // SAFETY: the launches were checked by Kernel::check and the buffers outlive the graph.
        unsafe { graph.launch() }.unwrap();
        graph.wait(Duration::MAX).unwrap();
        graph.wait(Duration::ZERO).expect("a finished graph's wait returns at once");
        let want = |n: usize| -> Vec<f32> {
            xs.iter().enumerate().map(|(i, x)| if i < n { (x * 2.0 + 1.0) * 2.0 + 1.0 } else { -1.0 }).collect()
        };
        assert_eq!(c.to_vec::<f32>().unwrap(), want(256));
        assert!(graph.update(&launches(&k, &[(&a, &b), (&b, &c)], 1024)).unwrap(), "same programs update in place");
        // SAFETY: as above.
        unsafe { graph.launch() }.unwrap();
        graph.wait(Duration::from_secs(60)).unwrap();
        assert_eq!(c.to_vec::<f32>().unwrap(), want(1024));
        assert!(!graph.update(&first[..1]).unwrap(), "another sequence is refused, not applied");
    }
}
