//! `settings-doc`: writes `docs/settings.md` from the binaries' own
//! definitions; `--check` exits 1 when the file differs from them.

use std::process::ExitCode;

#[expect(clippy::print_stdout, reason = "the command's answer")]
fn main() -> anyhow::Result<ExitCode> {
    let path = settings_doc::workspace_root().join(settings_doc::PATH);
    let generated = settings_doc::generate();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let check = match args.as_slice() {
        [] => false,
        [flag] if flag == "--check" => true,
        _ => {
            eprintln!("usage: settings-doc [--check]  (got {args:?})");
            return Ok(ExitCode::from(2));
        }
    };
    if check {
        let current = std::fs::read_to_string(&path).unwrap_or_default();
        if current == generated {
            println!("{} matches the code", settings_doc::PATH);
            return Ok(ExitCode::SUCCESS);
        }
        eprintln!(
            "{} differs from the code's settings: run `cargo run -p settings-doc` and commit it",
            settings_doc::PATH
        );
        return Ok(ExitCode::FAILURE);
    }
    std::fs::write(&path, generated)?;
    println!("wrote {}", settings_doc::PATH);
    Ok(ExitCode::SUCCESS)
}
