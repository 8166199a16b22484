//! The `kiln` binary: see the library crate for the commands.

/// Kernels are graphs, and some graph walks (size expressions, dropping a long chain of
/// nodes) recurse once per level: a big stack keeps a very deep kernel from overflowing it.
/// Only the pages actually used are committed.
const STACK_BYTES: usize = 1 << 30;

fn main() {
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let code = match std::thread::Builder::new().name("kiln".into()).stack_size(STACK_BYTES).spawn(|| kiln::main(args))
    {
        Ok(worker) => worker.join().unwrap_or(101),
        Err(e) => {
            eprintln!("error: cannot start the main thread: {e}");
            1
        }
    };
    std::process::exit(code);
}
