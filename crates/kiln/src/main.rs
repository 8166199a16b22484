//! The `kiln` binary: see the library crate for the commands.

/// Kernels are graphs, and some graph walks (size expressions, dropping a long chain of
/// nodes) recurse once per level: a big stack keeps a very deep kernel from overflowing it.
/// Only the pages actually used are committed.
const STACK_BYTES: usize = 1 << 30;

/// Runs the command line on a thread with a big stack. That thread ends the process itself
/// (`exit` flushes stdout and runs the exit handlers as on the main thread): returning would
/// make the thread release its stack mapping and the main thread wake to join it, about a
/// tenth of a millisecond of a warm `kiln run` spent on nothing. The main thread only waits,
/// and reports a thread that could not start or panicked.
fn main() {
    // Mesa's Vulkan device-select layer, loaded with wgpu's Vulkan instance, prints "error:
    // XDG_RUNTIME_DIR is invalid" twice on every device listing where that variable is
    // unset; it only reorders devices, so kiln turns it off unless the user chose.
    if std::env::var_os("NODEVICE_SELECT").is_none() {
        // SAFETY: no other thread exists yet, so nothing reads the environment concurrently.
        unsafe { std::env::set_var("NODEVICE_SELECT", "1") };
    }
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let code = match std::thread::Builder::new()
        .name("kiln".into())
        .stack_size(STACK_BYTES)
        .spawn(|| std::process::exit(kiln::main(args)))
    {
        // The thread returns only by panicking: its normal end exits the process.
        Ok(worker) => {
            let _ = worker.join();
            101
        }
        Err(e) => {
            eprintln!("error: cannot start the main thread: {e}");
            1
        }
    };
    std::process::exit(code);
}
