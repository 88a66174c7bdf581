//! Loading data files: the built-in tables, files on disk and TOML text, shared by every
//! kind of data file (hardware profiles, model specs) so each loads and reports errors
//! the same way.

use std::path::Path;

use serde::de::DeserializeOwned;

use crate::error::ModelError;

/// A built-in data file: (name, file name, embedded text).
pub(crate) type Builtin = (&'static str, &'static str, &'static str);

/// The built-in entry `name` (case-insensitive), parsed with `parse`.
pub(crate) fn by_name<T>(
    table: &[Builtin],
    dir: &str,
    kind: &'static str,
    name: &str,
    parse: impl Fn(&str, &str) -> Result<T, ModelError>,
) -> Result<T, ModelError> {
    let wanted = name.trim().to_ascii_lowercase();
    match table.iter().find(|(n, _, _)| *n == wanted) {
        Some((_, file, text)) => parse(text, &format!("built-in {dir}/{file}")),
        None => Err(ModelError::UnknownName {
            kind,
            name: name.to_string(),
            known: table
                .iter()
                .map(|(n, _, _)| *n)
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// `name_or_path` as a file when it names one (it contains a path separator or ends in
/// `.toml`), else as a built-in name.
pub(crate) fn resolve<T>(
    name_or_path: &str,
    by_name: impl Fn(&str) -> Result<T, ModelError>,
    parse: impl Fn(&str, &str) -> Result<T, ModelError>,
) -> Result<T, ModelError> {
    if name_or_path.contains(std::path::MAIN_SEPARATOR) || name_or_path.ends_with(".toml") {
        from_path(Path::new(name_or_path), parse)
    } else {
        by_name(name_or_path)
    }
}

/// Read `path` and parse it with `parse`, naming the file in errors.
pub(crate) fn from_path<T>(
    path: &Path,
    parse: impl Fn(&str, &str) -> Result<T, ModelError>,
) -> Result<T, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text, &path.display().to_string())
}

/// Deserialize TOML text; `origin` names the text in errors.
pub(crate) fn parse_toml<T: DeserializeOwned>(text: &str, origin: &str) -> Result<T, ModelError> {
    toml::from_str(text).map_err(|e| ModelError::Parse {
        origin: origin.to_string(),
        message: e.to_string(),
    })
}
