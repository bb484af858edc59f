//! Kernel choices measured on a device and kept for it: `wgllm-bench kernels --save`
//! times every correct mul_mat variant per weight type and records the fastest here, in
//! a small JSON file keyed by the adapter (name, backend, driver and its version), so a
//! later load on the same adapter runs what was measured fastest rather than the
//! static default for its kind of device.
//!
//! The file is `$WGLLM_TUNING`, else `$XDG_CACHE_HOME/wgllm/tuning.json`, else
//! `~/.cache/wgllm/tuning.json`; `WGLLM_TUNING=off` ignores it. A file that cannot be
//! read or parsed is reported once and ignored: a stale cache never stops a model.
//!
//! ```json
//! { "version": 1,
//!   "adapters": { "llvmpipe (LLVM 15.0.6, 256 bits) | Vulkan | ...": {
//!       "mul_mat": { "Q4_0": "ks", "Q8_0": "ks", "F16": "sg" },
//!       "weights": { "Q4_0": "texture" } } } }
//! ```
//!
//! `weights` says where matrices of a type are held (`gpu::upload::WeightMemory`);
//! a type it does not name stays in storage buffers.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{json, Value};

use crate::{Error, Result};

/// The environment variable naming the file, or `off`.
pub const TUNING_ENV: &str = "WGLLM_TUNING";

const VERSION: u64 = 1;

/// The file in use: `None` when turned off or when no cache folder is known.
pub fn path() -> Option<PathBuf> {
    match std::env::var_os(TUNING_ENV) {
        Some(v) if v == "off" => None,
        Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => {
            let base = std::env::var_os("XDG_CACHE_HOME")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            Some(base.join("wgllm").join("tuning.json"))
        }
    }
}

/// What identifies an adapter across runs: a driver update may change what is fastest,
/// so its version is part of the key.
pub fn adapter_key(info: &wgpu::AdapterInfo) -> String {
    format!(
        "{} | {:?} | {:04x}:{:04x} | {} | {}",
        info.name, info.backend, info.vendor, info.device, info.driver, info.driver_info
    )
}

/// The mul_mat variant names, and the weight memories, chosen per weight type name for
/// one adapter.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Choices {
    pub mul_mat: BTreeMap<String, String>,
    pub weights: BTreeMap<String, String>,
}

/// Every adapter's choices, as the file holds them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tuning {
    pub adapters: BTreeMap<String, Choices>,
}

impl Tuning {
    /// Parses the file's text; anything unexpected is an error that says where.
    pub fn parse(text: &str) -> Result<Tuning> {
        let bad = |what: &str| Error::invalid(format!("tuning file: {what}"));
        let v: Value = serde_json::from_str(text).map_err(|e| bad(&e.to_string()))?;
        if v.get("version").and_then(Value::as_u64) != Some(VERSION) {
            return Err(bad(&format!("expected \"version\": {VERSION}")));
        }
        let mut t = Tuning::default();
        let adapters = v
            .get("adapters")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("no \"adapters\" object"))?;
        for (key, a) in adapters {
            // One map of weight type names to names.
            let names = |field: &str| -> Result<BTreeMap<String, String>> {
                let Some(m) = a.get(field) else {
                    return Ok(BTreeMap::new());
                };
                let m = m
                    .as_object()
                    .ok_or_else(|| bad(&format!("{key}: \"{field}\" is not an object")))?;
                m.iter()
                    .map(|(ty, name)| match name.as_str() {
                        Some(n) => Ok((ty.clone(), n.to_string())),
                        None => Err(bad(&format!("{key}: {field} {ty} is not a name"))),
                    })
                    .collect()
            };
            let c = Choices {
                mul_mat: names("mul_mat")?,
                weights: names("weights")?,
            };
            t.adapters.insert(key.clone(), c);
        }
        Ok(t)
    }

    pub fn to_json(&self) -> String {
        let adapters: serde_json::Map<String, Value> = self
            .adapters
            .iter()
            .map(|(k, c)| {
                let choices = json!({ "mul_mat": c.mul_mat, "weights": c.weights });
                (k.clone(), choices)
            })
            .collect();
        let v = json!({ "version": VERSION, "adapters": adapters });
        serde_json::to_string_pretty(&v).unwrap_or_default()
    }

    /// The file's contents; empty when there is no file. `Err` when it exists but
    /// cannot be read or parsed.
    pub fn load() -> Result<Tuning> {
        let Some(p) = path() else {
            return Ok(Tuning::default());
        };
        match std::fs::read_to_string(&p) {
            Ok(text) => {
                Tuning::parse(&text).map_err(|e| Error::invalid(format!("{}: {e}", p.display())))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Tuning::default()),
            Err(e) => Err(Error::Io { path: p, source: e }),
        }
    }

    /// Writes the file (creating its folder), through a temporary file renamed into
    /// place so a reader never sees half of it.
    pub fn save(&self) -> Result<PathBuf> {
        let p = path().ok_or_else(|| {
            Error::invalid(format!(
                "no tuning file: {TUNING_ENV} is off, or neither XDG_CACHE_HOME nor HOME is set"
            ))
        })?;
        let io = |path: &std::path::Path, e| Error::Io {
            path: path.to_path_buf(),
            source: e,
        };
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        }
        let tmp = p.with_extension("json.tmp");
        std::fs::write(&tmp, self.to_json() + "\n").map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, &p).map_err(|e| io(&p, e))?;
        Ok(p)
    }
}

/// This adapter's choices from the file, reporting (not failing on) a bad file.
pub fn choices_for(info: &wgpu::AdapterInfo) -> Choices {
    match Tuning::load() {
        Ok(mut t) => t.adapters.remove(&adapter_key(info)).unwrap_or_default(),
        Err(e) => {
            eprintln!("warning: ignoring the kernel tuning file: {e}");
            Choices::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_what_it_cannot_read() {
        let mut t = Tuning::default();
        let mut c = Choices::default();
        c.mul_mat.insert("Q4_0".into(), "ks".into());
        c.mul_mat.insert("F16".into(), "sg".into());
        c.weights.insert("Q4_0".into(), "texture".into());
        t.adapters.insert("gpu | Vulkan".into(), c);
        assert_eq!(Tuning::parse(&t.to_json()).unwrap(), t);
        for bad in [
            "",
            "[]",
            r#"{"version": 2, "adapters": {}}"#,
            r#"{"version": 1}"#,
            r#"{"version": 1, "adapters": {"a": {"mul_mat": []}}}"#,
            r#"{"version": 1, "adapters": {"a": {"mul_mat": {"Q4_0": 3}}}}"#,
            r#"{"version": 1, "adapters": {"a": {"weights": {"Q4_0": 3}}}}"#,
        ] {
            assert!(Tuning::parse(bad).is_err(), "{bad}");
        }
    }
}
