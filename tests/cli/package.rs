//! The Debian package (`packaging/build-deb`): built from the test build's
//! binary (`--profile dev --no-build`: the binary the other tests run is
//! never rebuilt under them), then read with dpkg-deb — what it installs
//! where, its dependencies, its conffiles, its maintainer scripts and its
//! unit. (Installing it under a real systemd is tests/service/systemd.rs's.)

use crate::support;

use std::path::Path;
use std::process::Command;

use support::repo_root;

fn dpkg_deb(args: &[&str], deb: &Path) -> String {
    let out = Command::new("dpkg-deb")
        .args(args)
        .arg(deb)
        .output()
        .expect("dpkg-deb is missing: apt-get install dpkg");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_package_installs_the_service_its_docs_man_pages_and_completions() {
    let out_dir = tempfile::tempdir().unwrap();
    let mut build = Command::new(repo_root().join("packaging/build-deb"));
    support::without_package_env(&mut build)
        .args(["--profile", "dev", "--no-build"])
        .env("CARGO_DEB_ARGS", format!("-o {}", out_dir.path().display()))
        .current_dir(repo_root());
    let built = build.output().expect("cannot run packaging/build-deb");
    assert!(
        built.status.success(),
        "packaging/build-deb failed (cargo-deb missing? cargo install cargo-deb --version 3.8.0 --locked; .ci/run installs it):\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let deb = std::fs::read_dir(out_dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .expect("no .deb written");

    let info = dpkg_deb(&["-I"], &deb);
    assert!(info.contains("Package: tend"), "{info}");
    assert!(
        info.contains(&format!("Version: {}-1", env!("CARGO_PKG_VERSION"))),
        "{info}"
    );
    assert!(
        info.contains("libssl3"),
        "the dependencies are computed: {info}"
    );

    let contents = dpkg_deb(&["-c"], &deb);
    for path in [
        "./usr/bin/tend",
        "./usr/lib/systemd/system/tend.service",
        "./etc/tend/tend.toml.example",
        "./usr/share/doc/tend/operations.md",
        "./usr/share/doc/tend/runbooks/operation-failed.md",
        "./usr/share/doc/tend/prometheus/tend-rules.yml",
        "./usr/share/man/man1/tend.1.gz",
        "./usr/share/man/man1/tend-override-set.1.gz",
        "./usr/share/bash-completion/completions/tend",
        "./usr/share/zsh/vendor-completions/_tend",
        "./usr/share/fish/vendor_completions.d/tend.fish",
    ] {
        assert!(
            contents.lines().any(|l| l.ends_with(path)),
            "{path} is not in the package:\n{contents}"
        );
    }

    let control = tempfile::tempdir().unwrap();
    let unpacked = tempfile::tempdir().unwrap();
    let status = Command::new("dpkg-deb")
        .arg("-e")
        .arg(&deb)
        .arg(control.path().join("DEBIAN"))
        .status()
        .unwrap();
    assert!(status.success());
    let status = Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(unpacked.path())
        .status()
        .unwrap();
    assert!(status.success());
    let read = |p: &Path| std::fs::read_to_string(p).unwrap();
    let conffiles = read(&control.path().join("DEBIAN/conffiles"));
    assert_eq!(conffiles.trim(), "/etc/tend/tend.toml.example");
    // Enabled at install, started (the unit's condition holds it until the
    // configuration exists), restarted after an upgrade, stopped at removal.
    let postinst = read(&control.path().join("DEBIAN/postinst"));
    assert!(
        postinst.contains("deb-systemd-helper enable tend.service"),
        "{postinst}"
    );
    assert!(postinst.contains("_dh_action=restart"), "{postinst}");
    let prerm = read(&control.path().join("DEBIAN/prerm"));
    assert!(
        prerm.contains("deb-systemd-invoke stop tend.service"),
        "{prerm}"
    );
    // The state goes on purge only.
    let postrm = read(&control.path().join("DEBIAN/postrm"));
    assert!(
        postrm.contains(
            "if [ \"$1\" = \"purge\" ]; then\n    rm -rf /var/lib/tend /var/lib/private/tend"
        ),
        "{postrm}"
    );
    let unit = read(&unpacked.path().join("usr/lib/systemd/system/tend.service"));
    assert!(
        unit.contains("ConditionPathExists=/etc/tend/tend.toml"),
        "{unit}"
    );
    assert!(
        unit.contains("ExecStart=/usr/bin/tend --config /etc/tend/tend.toml run"),
        "{unit}"
    );
    assert!(
        unit.contains("Documentation=file:///usr/share/doc/tend/operations.md"),
        "{unit}"
    );
    // The example configuration is a configuration tend accepts (it names
    // credentials only a service has: checked for its form).
    let example = read(&unpacked.path().join("etc/tend/tend.toml.example"));
    assert!(
        example.contains("state_dir = \"/var/lib/tend\""),
        "{example}"
    );
    let version = Command::new(unpacked.path().join("usr/bin/tend"))
        .arg("--version")
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&version.stdout);
    assert!(version.contains("(commit "), "{version}");
}
