//! `cargo run --example dist-docs -- DIR`: writes gpureap's man pages into DIR/man (one per
//! command and subcommand) and its shell completions into DIR/completions, from the clap
//! definitions of src/cli.rs. scripts/release ships them in every artifact; the gpureap
//! binary itself carries none of this.

mod pages;

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(folder), None) = (args.next(), args.next()) else {
        eprintln!("usage: dist-docs DIR   (writes DIR/man/*.1 and DIR/completions/*)");
        return ExitCode::from(2);
    };
    let folder = PathBuf::from(folder);
    let written = pages::man_pages(&folder.join("man")).and_then(|mut man| {
        man.extend(pages::completions(&folder.join("completions"))?);
        Ok(man)
    });
    match written {
        Ok(written) => {
            println!(
                "dist-docs: {} files under {}",
                written.len(),
                folder.display()
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("dist-docs: {}: {error}", folder.display());
            ExitCode::FAILURE
        }
    }
}
