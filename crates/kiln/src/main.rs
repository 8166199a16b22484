//! The `kiln` binary: see the library crate for the commands.

fn main() {
    std::process::exit(kiln::main(std::env::args_os().skip(1)));
}
