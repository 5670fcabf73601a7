use std::process::ExitCode;

fn main() -> ExitCode {
    // SAFETY: the first thing the process does: no other thread exists.
    unsafe { tend::heap::tune() };
    // Test builds: the failpoints FAILPOINTS names (nothing otherwise).
    let _failpoints = tend::failpoint::setup();
    let cli = match tend::parse(std::env::args_os()) {
        Ok(cli) => cli,
        Err(code) => return ExitCode::from(code),
    };
    // The agent sets its arenas and how its heap gives memory back once
    // its configuration is read (`heap::tune_agent`).
    if !cli.runs_the_agent() {
        // SAFETY: still before any other thread (parsing starts none).
        unsafe { tend::heap::two_arenas() };
    }
    ExitCode::from(tend::run_parsed(cli))
}
