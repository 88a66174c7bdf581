//! A raw public trace (Mooncake FAST'25 JSONL, Azure LLM or multimodal CSV) handed to a
//! reader of moonagent's schema fails with `TraceError::NotImported`, whose one line names
//! the `moonagent trace import` command; that command's importer then reads the file.

use std::path::{Path, PathBuf};

use moonagent_traces::import::{AttachImages, ImportKind, Imported};
use moonagent_traces::stats::stats_of_file;
use moonagent_traces::{write_trace, StatsConfig, TraceError, TraceReader};

const MOONCAKE: &str = r#"{"timestamp": 0, "input_length": 1100, "output_length": 20, "hash_ids": [0, 1, 2]}
{"timestamp": 5, "input_length": 600, "output_length": 7, "hash_ids": [0, 3]}
"#;
const AZURE_LLM: &str = "TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
";
const AZURE_MM: &str = "TIMESTAMP,NumImages,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,1,2374,44
2023-11-16 18:15:50.9951690,0,396,109
";

fn write(name: &str, text: &str) -> PathBuf {
    let dir = scratch_dir("raw-hint");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write sample");
    p
}

fn not_imported(path: &PathBuf) -> (ImportKind, PathBuf, String) {
    match TraceReader::open(path) {
        Err(e @ TraceError::NotImported { .. }) => {
            let TraceError::NotImported { kind, ref out, .. } = e else {
                unreachable!()
            };
            (kind, out.clone(), e.to_string())
        }
        Err(e) => panic!("{}: expected NotImported, got {e}", path.display()),
        Ok(_) => panic!("{}: expected NotImported, read it", path.display()),
    }
}

#[test]
fn raw_traces_name_their_import_command_and_it_works() {
    for (name, text, want, cmd, n) in [
        ("mc.jsonl", MOONCAKE, ImportKind::Mooncake, "mooncake", 2),
        ("llm.csv", AZURE_LLM, ImportKind::AzureLlm, "azure-llm", 2),
        ("mm.csv", AZURE_MM, ImportKind::AzureMm, "azure-mm", 2),
    ] {
        let path = write(name, text);
        let (kind, out, msg) = not_imported(&path);
        assert_eq!(kind, want, "{msg}");
        assert!(!msg.contains('\n'), "one line: {msg}");
        let hint = format!(
            "moonagent trace import {cmd} {} --out {}",
            path.display(),
            out.display()
        );
        assert!(msg.ends_with(&hint), "{msg}");
        // `trace stats` goes through the same reader.
        let e = stats_of_file(&path, StatsConfig::default()).expect_err("raw");
        assert!(matches!(e, TraceError::NotImported { .. }), "{e}");

        // The command it names reads the file.
        let attach = (kind == ImportKind::AzureMm)
            .then(|| AttachImages::with_overrides(0, &[]).expect("attach"));
        let imp = Imported::open(kind, &path, attach).expect("import");
        assert_eq!(
            write_trace(&out, &imp.header, imp.requests, |_| {}).expect("write"),
            n
        );
        let back = TraceReader::open(&out).expect("imported trace reads");
        assert_eq!(back.count(), n as usize);
    }
}

#[test]
fn other_bad_first_lines_keep_the_header_error() {
    for (name, text) in [
        ("plain.jsonl", "{\"timestamp\": 0}\n"),
        ("other.csv", "a,b,c\n1,2,3\n"),
    ] {
        let path = write(name, text);
        match TraceReader::open(&path) {
            Err(e @ TraceError::Invalid { .. }) => assert_eq!(e.field(), Some("header"), "{e}"),
            Err(e) => panic!("{name}: {e}"),
            Ok(_) => panic!("{name}: read"),
        }
    }
}

/// This test binary's scratch folder under cargo's `target/tmp`, emptied once per run: the
/// last run's files stay there to look at, and no run leaves one in the system temp dir.
fn scratch_dir(name: &str) -> PathBuf {
    static EMPTIED: std::sync::Once = std::sync::Once::new();
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    EMPTIED.call_once(|| {
        let _ = std::fs::remove_dir_all(&d);
    });
    d
}
