//! libFuzzer target: see `checks::declaration` (tests/fuzz/checks.rs).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::declaration(data));
