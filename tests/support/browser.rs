//! Debian's Chromium, headless, for tests of the report page.

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn chromium() -> PathBuf {
    for candidate in ["/usr/bin/chromium", "/usr/bin/chromium-browser"] {
        if Path::new(candidate).exists() {
            return candidate.into();
        }
    }
    panic!(
        "Chromium is needed to test latest.html: `apt-get update && apt-get install -y chromium` (.ci/run does this)"
    );
}

/// Runs headless Chromium on `url` with `args` (flags that keep it off the
/// network and out of the user's profile).
pub fn browse(profile: &Path, args: &[&str], url: &str) -> std::process::Output {
    Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .output()
        .expect("cannot run chromium")
}
