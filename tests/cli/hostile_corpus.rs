//! Replays `tests/corpus/hostile/*.sh`: repositories someone who can commit
//! to the tracked branch might push (see the corpus README). For each, the
//! commands named in its header exit as stated, never with a panic (101)
//! or an abort (134), print no raw escape character, and leak the canary
//! secret nowhere: not in any output, not in any file of the state dir.

use crate::support;

use std::path::Path;
use std::process::Command;

use support::TendCommand;
use support::config::TendConfig;
use support::git::TestRepo;

const CANARY: &str = "canary_SECRET_7f3a9e";

/// One `# run: ARGS => CODE [: TEXT]` header line, and the `# never:
/// TEXT` lines under it.
#[derive(Debug)]
struct Run {
    args: Vec<String>,
    code: i32,
    expect: Option<String>,
    never: Vec<String>,
}

fn runs(script: &str) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    for line in script.lines() {
        if let Some(text) = line.strip_prefix("# never: ") {
            out.last_mut()
                .expect("`# never:` belongs to the `# run:` line above it")
                .never
                .push(text.to_string());
            continue;
        }
        let Some(line) = line.strip_prefix("# run: ") else {
            continue;
        };
        let (args, rest) = line.split_once(" => ").expect("`# run: ARGS => CODE`");
        let (code, expect) = match rest.split_once(" : ") {
            Some((code, text)) => (code, Some(text.to_string())),
            None => (rest, None),
        };
        out.push(Run {
            args: args.split_whitespace().map(str::to_string).collect(),
            code: code.trim().parse().expect("an exit code"),
            expect,
            never: Vec::new(),
        });
    }
    out
}

/// Every file under `dir` that holds `needle`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                dirs.push(path);
            } else if kind.is_file()
                && std::fs::read(&path)
                    .unwrap()
                    .windows(needle.len())
                    .any(|w| w == needle)
            {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

/// One stage of a script: shell text run in the work tree (and what it
/// leaves committed), then its `# run:` lines. Stages are separated by a
/// line starting `# ---`; a script without one is a single stage.
struct Stage {
    shell: String,
    runs: Vec<Run>,
}

fn stages(script: &str) -> Vec<Stage> {
    let mut out = Vec::new();
    let mut shell = String::new();
    for line in script.lines() {
        if line.starts_with("# ---") {
            out.push(Stage {
                runs: runs(&shell),
                shell: std::mem::take(&mut shell),
            });
        } else {
            shell.push_str(line);
            shell.push('\n');
        }
    }
    out.push(Stage {
        runs: runs(&shell),
        shell,
    });
    out
}

fn replay(script_path: &Path) {
    let name = script_path
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    let script = std::fs::read_to_string(script_path).unwrap();
    let stages = stages(&script);
    assert!(
        stages.iter().any(|s| !s.runs.is_empty()),
        "{name}: no `# run:` line"
    );
    let repo = TestRepo::new();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), CANARY).unwrap();
    std::fs::set_permissions(
        dir.path().join("token"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let config = TendConfig::new(dir.path(), &repo.url())
        .source("token_file", "\"token\"")
        .status("reports_dir", "\"reports\"")
        .write()
        .display()
        .to_string();
    // The last command's stdout, for a later stage (a patch to apply).
    let last_out = dir.path().join("last.out");
    std::fs::write(&last_out, "").unwrap();
    for (number, stage) in stages.iter().enumerate() {
        let file = dir.path().join(format!("stage-{number}.sh"));
        std::fs::write(&file, &stage.shell).unwrap();
        let built = Command::new("sh")
            .arg("-e")
            .arg(&file)
            .env("LAST_OUT", &last_out)
            .current_dir(repo.path())
            .output()
            .unwrap();
        assert!(
            built.status.success(),
            "{name}: stage {number} of the script failed: {}{}",
            String::from_utf8_lossy(&built.stdout),
            String::from_utf8_lossy(&built.stderr)
        );
        repo.commit(&format!("{name}, stage {number}"));
        for run in &stage.runs {
            let mut args = vec!["--config", config.as_str()];
            args.extend(run.args.iter().map(String::as_str));
            // Hostile input must be refused, not parsed for minutes: a
            // command that hangs fails the test.
            let out = TendCommand::new(&args)
                .within(std::time::Duration::from_secs(60))
                .expect_code(run.code);
            std::fs::write(&last_out, &out.stdout).unwrap();
            let all = format!("{}{}", out.stdout, out.stderr);
            let what = format!("{name}: tend {}", run.args.join(" "));
            assert!(
                !all.contains('\x1b'),
                "{what}: a raw escape reached the output:\n{all:?}"
            );
            assert!(
                !all.contains(CANARY),
                "{what}: the secret was printed:\n{all}"
            );
            if let Some(expect) = &run.expect {
                assert!(
                    all.contains(expect.as_str()),
                    "{what}: expected `{expect}` in:\n{all}"
                );
            }
            for never in &run.never {
                assert!(
                    !all.contains(never.as_str()),
                    "{what}: `{never}` must not be in:\n{all}"
                );
            }
        }
    }
    let leaked: Vec<String> = files_holding(dir.path(), CANARY.as_bytes())
        .into_iter()
        .filter(|f| !f.ends_with("/token"))
        .collect();
    assert!(leaked.is_empty(), "{name}: the secret is in {leaked:?}");
}

#[test]
fn every_hostile_repository_is_handled_as_documented() {
    let corpus = support::repo_root().join("tests/corpus/hostile");
    let mut scripts: Vec<_> = std::fs::read_dir(&corpus)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "sh"))
        .collect();
    scripts.sort();
    assert!(
        scripts.len() >= 12,
        "the corpus has {} scripts",
        scripts.len()
    );
    for script in &scripts {
        replay(script);
    }
}
