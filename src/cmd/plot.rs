//! Figures the commands write beside their tables (`moonagent_sim::plot` draws them; this
//! module turns a command's results into the figure's rows and writes the file).

use std::path::Path;

use anyhow::{Context, Result};
use moonagent_core::store::{DataType, PolicyConfig};
use moonagent_sim::plot::{self, Curve, Panel};

use super::replay::CapacityRun;

/// Write `svg` to `path`, saying so on stderr.
pub fn write(path: &Path, svg: &str) -> Result<()> {
    std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// Hit rate vs capacity, one panel per data type replayed, every policy a curve, and
/// Belady's MIN where the replay has one (one data type of one object size).
pub fn capacity_curves(title: &str, runs: &[CapacityRun], path: &Path) -> Result<()> {
    let Some(first) = runs.first() else {
        return Ok(());
    };
    let mut panels = Vec::new();
    for t in DataType::ALL {
        if !first
            .results
            .iter()
            .any(|r| r.by_type.contains_key(t.name()))
        {
            continue;
        }
        let curves = first
            .results
            .iter()
            .enumerate()
            .map(|(i, r)| Curve {
                label: r.label.clone(),
                offline: matches!(
                    r.policy,
                    PolicyConfig::Belady {} | PolicyConfig::BeladyCost {}
                ),
                points: runs
                    .iter()
                    .map(|run| (run.capacity_bytes, run.results[i].of(t).hit_rate()))
                    .collect(),
            })
            .collect();
        let bound = runs
            .iter()
            .map(|run| {
                let (h, n) = *run.min_bound.get(t.name())?;
                Some((run.capacity_bytes, h as f64 / n.max(1) as f64))
            })
            .collect::<Option<Vec<_>>>()
            .map(|points| Curve {
                label: "Belady MIN bound".into(),
                points,
                offline: true,
            });
        panels.push(Panel {
            title: format!("{} hit rate vs capacity", t.name()),
            y_desc: format!("{} hit rate, all lookups", t.name()),
            curves,
            bound,
        });
    }
    write(
        path,
        &plot::capacity(title, &panels).map_err(anyhow::Error::msg)?,
    )
}
