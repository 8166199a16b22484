//! libLLVM is opened by the LLVM pair's first compile, never by opening the CPU device (issue 43):
//! a process that opens the device, lists its pairs and renders kernels maps no LLVM. A test
//! binary of its own, so that no other test has loaded LLVM into the process first.

use kiln_cpu::{IsaTarget, LLVM_PAIR};
use kiln_device::kiln_ir::{KernelBuilder, Scalar};

/// Whether this process maps a libLLVM file, by its memory map.
fn maps_libllvm() -> bool {
    std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps").contains("libLLVM")
}

#[test]
fn opening_the_cpu_device_does_not_load_libllvm_and_compiling_does() {
    assert!(!maps_libllvm(), "libLLVM is mapped before anything ran");
    let device = kiln_cpu::open(&kiln_cpu::CPU).unwrap();
    if let Some((_, why)) = device.missing_compilers().into_iter().find(|(name, _)| name == LLVM_PAIR) {
        kiln_device::testing::skip_unless_required("cpu-llvm", "opening_the_cpu_device_does_not_load_libllvm", &why);
        return;
    }
    // (the default pair may be the C one: KILN_CC or KILN_CPU_COMPILER chose it)
    assert!(device.compiler_names().iter().any(|name| name == LLVM_PAIR), "the LLVM pair is offered");
    let llvm = device.with_default_compiler(LLVM_PAIR).unwrap();
    let mut k = KernelBuilder::new();
    let n = k.var("n", 1, 64);
    let a = k.param(0, Scalar::F32, &n);
    let i = k.global(0, &n);
    let v = a.at(&i).load();
    k.store(&a.at(&i), &(&v + &v));
    let sink = k.finish().unwrap();
    let spec = llvm.renderer().render(&sink, Some("twice")).unwrap();
    assert!(spec.src.contains("define"), "LLVM IR:\n{}", spec.src);
    assert!(!maps_libllvm(), "opening the device, picking the pair or rendering a kernel loaded libLLVM");
    let compiler = kiln_cpu::llvm::LlvmCompiler::new(IsaTarget::native()).unwrap();
    assert!(!maps_libllvm(), "making a compiler loaded libLLVM");
    compiler.compile_ir("twice", &spec.src).unwrap();
    assert!(maps_libllvm(), "the first compile loads libLLVM (the check above sees it)");
}
