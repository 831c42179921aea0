//! The settings reference against the code, three ways: the file is what
//! the binaries declare; every variable read without clap is in the direct
//! table (and every one there is read); every variable the demo, the tests,
//! the benches and the scripts set is a setting some binary reads — so a
//! renamed or retired setting cannot live on in a test or the demo,
//! silently doing nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use regex::Regex;
use settings_doc::{binaries, direct, workspace_root};

/// The system's own variables, not Meterline's.
const SYSTEM: &[&str] = &["HOME", "PATH"];

/// The one test that sets retired settings, to see them refused.
const RETIRED_TEST: &str = "tests/tests/retired_settings.rs";

/// Source files (`.rs`, and `.sh` under `scripts/` and `.ci/`) of the
/// workspace, relative to its root, with their text.
fn sources() -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                let hidden = name.starts_with('.') && name != ".ci";
                if !hidden && name != "target" && name != "node_modules" {
                    walk(root, &path, out);
                }
            } else if name.ends_with(".rs") || name.ends_with(".sh") || name == "run" {
                let rel = path.strip_prefix(root).unwrap().display().to_string();
                if let Ok(text) = std::fs::read_to_string(&path) {
                    out.insert(rel, text);
                }
            }
        }
    }
    let root = workspace_root();
    let mut out = BTreeMap::new();
    walk(&root, &root, &mut out);
    out
}

/// Every environment variable a binary's clap command reads, and the retired ones.
fn declared() -> (BTreeSet<String>, BTreeSet<String>) {
    fn visit(cmd: &clap::Command, live: &mut BTreeSet<String>, retired: &mut BTreeSet<String>) {
        for arg in cmd.get_arguments() {
            if let Some(env) = arg.get_env() {
                let env = env.to_string_lossy().into_owned();
                if arg.get_help_heading() == Some(serving::retired::HEADING) {
                    retired.insert(env);
                } else {
                    live.insert(env);
                }
            }
        }
        for sub in cmd.get_subcommands() {
            visit(sub, live, retired);
        }
    }
    let (mut live, mut retired) = (BTreeSet::new(), BTreeSet::new());
    for b in binaries::all() {
        visit(&b.command, &mut live, &mut retired);
    }
    (live, retired)
}

#[test]
fn the_reference_is_what_the_code_declares() {
    let path = workspace_root().join(settings_doc::PATH);
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = settings_doc::generate();
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()));
        panic!(
            "{} differs from the code from line {}:\n  file: {:?}\n  code: {:?}\n\
             run `cargo run -p settings-doc` and commit the result",
            settings_doc::PATH,
            line + 1,
            committed.lines().nth(line),
            generated.lines().nth(line)
        );
    }
}

#[test]
fn every_variable_read_directly_is_listed_and_every_listed_one_is_read() {
    let rust = Regex::new(
        r#"(?:env::var(?:_os)?|\bsetting|\buser_setting|\bnumber)\(\s*"([A-Z][A-Z0-9_]*)""#,
    )
    .unwrap();
    let shell = Regex::new(r"\$\{([A-Z][A-Z0-9_]*):-").unwrap();
    let mut read: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, text) in sources() {
        if file.starts_with("settings-doc/") {
            continue;
        }
        let re = if file.ends_with(".rs") { &rust } else { &shell };
        for cap in re.captures_iter(&text) {
            if !file.ends_with(".rs") && assigned_in_script(&text, &cap[1]) {
                continue;
            }
            read.entry(cap[1].to_owned())
                .or_default()
                .insert(file.clone());
        }
    }
    for name in SYSTEM {
        read.remove(*name);
    }
    let listed: BTreeSet<String> = direct::ALL.iter().map(|d| d.name.to_owned()).collect();
    let unlisted: Vec<String> = read
        .iter()
        .filter(|(name, _)| !listed.contains(*name))
        .map(|(name, files)| format!("{name} (read in {files:?})"))
        .collect();
    assert!(
        unlisted.is_empty(),
        "read from the environment but missing from settings-doc/src/direct.rs: {unlisted:?}"
    );
    let unread: Vec<&String> = listed.iter().filter(|n| !read.contains_key(*n)).collect();
    assert!(
        unread.is_empty(),
        "listed in settings-doc/src/direct.rs but read nowhere: {unread:?}"
    );
}

/// A shell variable the script itself assigns (`PID=$!`), as opposed to
/// one it reads from the environment with a default (`N="${N:-1000}"`).
fn assigned_in_script(text: &str, name: &str) -> bool {
    let read_with_default = format!("{name}=\"${{{name}:-");
    text.lines()
        .map(str::trim_start)
        .any(|line| line.starts_with(&format!("{name}=")) && !line.starts_with(&read_with_default))
}

#[test]
fn every_variable_the_demo_tests_and_scripts_set_is_a_setting() {
    let (live, retired) = declared();
    let known: BTreeSet<String> = live
        .iter()
        .cloned()
        .chain(direct::ALL.iter().map(|d| d.name.to_owned()))
        .collect();
    let prefixes =
        "GATEWAY|INGEST|ARCHIVE|ROLLUP|BILLING|ENGINE|HTTP|AUDIT|DEMO|METERLINE|DRILL|NISSHI";
    let rust = Regex::new(&format!(r#""((?:{prefixes})_[A-Z0-9_]+)""#)).unwrap();
    let shell = Regex::new(&format!(r"\b((?:{prefixes})_[A-Z0-9_]+)=")).unwrap();
    let mut problems = Vec::new();
    for (file, text) in sources() {
        if file.starts_with("settings-doc/") || file == RETIRED_TEST {
            continue;
        }
        let re = if file.ends_with(".rs") { &rust } else { &shell };
        for (n, line) in text.lines().enumerate() {
            // A retired setting's own declaration.
            if line.contains("serving::retired::HEADING") {
                continue;
            }
            for cap in re.captures_iter(line) {
                let name = &cap[1];
                // An upstream's secret, named by its `identity_secret_env`
                // in an upstreams file the same source writes.
                if name.ends_with("_SECRET") && text.contains("identity_secret_env") {
                    continue;
                }
                if retired.contains(name) {
                    problems.push(format!("{file}:{}: {name} is retired", n + 1));
                } else if !known.contains(name) {
                    problems.push(format!("{file}:{}: {name} is read by no binary", n + 1));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn every_retired_setting_is_refused_by_a_test() {
    let (_, retired) = declared();
    let text = std::fs::read_to_string(workspace_root().join(RETIRED_TEST)).unwrap();
    let untested: Vec<&String> = retired
        .iter()
        .filter(|name| !text.contains(&format!("\"{name}\"")))
        .collect();
    assert!(
        untested.is_empty(),
        "retired settings no test sees refused ({RETIRED_TEST}): {untested:?}"
    );
}
