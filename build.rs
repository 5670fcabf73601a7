//! Names the build in `tend --version`: the commit it was built from
//! (`TEND_COMMIT` when set, as a package built from a tarball sets it;
//! else `git rev-parse`; else "unknown") and the cargo features; and
//! whether the test hooks are compiled in (`cfg(test_hooks)`: the
//! `test-hooks` feature in a build with debug assertions only).

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=TEND_COMMIT");
    println!("cargo:rerun-if-changed=.git/HEAD");
    if let Ok(head) = std::fs::read_to_string(".git/HEAD")
        && let Some(reference) = head.trim().strip_prefix("ref: ")
    {
        println!("cargo:rerun-if-changed=.git/{reference}");
        println!("cargo:rerun-if-changed=.git/packed-refs");
    }
    let commit = std::env::var("TEND_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| {
            Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .and_then(|o| String::from_utf8(o.stdout).ok())
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "unknown".into());
    // The test hooks (pause points, injected wedges and panics) exist only
    // in a build with debug assertions: `cargo build --release
    // --all-targets` turns the feature on for the binary too (the tests'
    // dev-dependency on this crate), and a binary copied out of
    // target/release must never answer TEND_TEST_*.
    println!("cargo::rustc-check-cfg=cfg(test_hooks)");
    let hooks = std::env::var_os("CARGO_FEATURE_TEST_HOOKS").is_some()
        && std::env::var_os("CARGO_CFG_DEBUG_ASSERTIONS").is_some();
    if hooks {
        println!("cargo:rustc-cfg=test_hooks");
    }
    let mut features: Vec<String> = std::env::vars()
        .filter_map(|(k, _)| k.strip_prefix("CARGO_FEATURE_").map(str::to_string))
        .map(|f| f.to_ascii_lowercase().replace('_', "-"))
        .filter(|f| f != "default" && (f != "test-hooks" || hooks))
        .collect();
    features.sort();
    let features = if features.is_empty() {
        "none".to_string()
    } else {
        features.join(", ")
    };
    println!("cargo:rustc-env=TEND_COMMIT={commit}");
    println!("cargo:rustc-env=TEND_FEATURES={features}");
}
