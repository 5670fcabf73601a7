use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(tend::cli::main(std::env::args_os()))
}
