//! Durable tables on a server started with `--data-dir`: every sealed version of a table created
//! with `durability = snapshot` is written as partition images (docs/partition-image.md) before
//! SEAL is acknowledged, a small catalog per table follows every admin change, and a restarting
//! server loads both before it accepts connections.
//!
//! Layout under the data directory (docs/ARCHITECTURE.md, "Durable tables"):
//!
//! ```text
//! DIR/tables/<name>-<incarnation as 16 hex digits>/catalog      the catalog (text, below)
//! DIR/tables/<name>-<incarnation>/v<version>/p<partition>.img  one image per held partition
//! ```
//!
//! `<name>` keeps `[A-Za-z0-9_-]` and writes any other byte as `%XX`, so a table name can never
//! reach outside its directory. Every file is written to a `.tmp` name, fsynced, renamed over the
//! final name, and its directory fsynced: a crash leaves the old file or the new one, never half of
//! one. A version's images are all durable before the catalog lists the version, so the catalog
//! never names a version that is not whole on disk.
//!
//! The catalog is text, one `key value` line each, in this order, ending with an xxh3-64 of every
//! byte before the `sum` line:
//!
//! ```text
//! ramgrid-catalog 1
//! name <encoded name>
//! incarnation <16 hex>
//! partitions <n>
//! replication <n>
//! value_type bytes | i64 | f64 | f32x<dim>
//! high_water <n>
//! current <n, 0 = none or an open version>
//! sealed <v> <v> ...
//! sum <16 hex>
//! ```
//!
//! File I/O here is blocking and runs on the worker thread that handles the admin request: admin
//! requests are rare, and a SEAL must not be answered before its images are on disk anyway.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use ramgrid_store::tables::{Durability, TableSpec, Tables, ValueType};
use ramgrid_store::Error as StoreError;
use xxhash_rust::xxh3::xxh3_64;

/// What a server with `--data-dir` keeps on disk.
#[derive(Debug)]
pub struct Persist {
    tables_dir: PathBuf,
}

/// A table's catalog, as written and as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Catalog {
    /// The table's spec (durability is always snapshot: only such tables have a catalog).
    pub spec: TableSpec,
    /// Highest version number ever created in the table.
    pub high_water: u32,
    /// Current version if it is sealed (and so on disk), else 0.
    pub current: u32,
    /// Sealed versions, ascending, whose images are all on disk.
    pub sealed: Vec<u32>,
}

/// `name` as a file-name component: `[A-Za-z0-9_-]` kept, every other byte `%XX`.
fn encode_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode_name(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn value_type_text(t: ValueType) -> String {
    match t {
        ValueType::Bytes => "bytes".into(),
        ValueType::I64 => "i64".into(),
        ValueType::F64 => "f64".into(),
        ValueType::F32Vec { dim } => format!("f32x{dim}"),
    }
}

fn parse_value_type(s: &str) -> Option<ValueType> {
    Some(match s {
        "bytes" => ValueType::Bytes,
        "i64" => ValueType::I64,
        "f64" => ValueType::F64,
        _ => ValueType::F32Vec {
            dim: s.strip_prefix("f32x")?.parse().ok()?,
        },
    })
}

impl Catalog {
    /// The catalog text (module docs), checksum line included.
    pub fn to_text(&self) -> String {
        let s = &self.spec;
        let sealed: Vec<String> = self.sealed.iter().map(u32::to_string).collect();
        let body = format!(
            "ramgrid-catalog 1\nname {}\nincarnation {:016x}\npartitions {}\nreplication {}\n\
             value_type {}\nhigh_water {}\ncurrent {}\nsealed {}\n",
            encode_name(&s.name),
            s.incarnation,
            s.partitions,
            s.replication,
            value_type_text(s.value_type),
            self.high_water,
            self.current,
            sealed.join(" ")
        );
        let sum = xxh3_64(body.as_bytes());
        format!("{body}sum {sum:016x}\n")
    }

    /// Parse [`Catalog::to_text`]'s output; says what is wrong otherwise.
    pub fn parse(text: &str) -> Result<Catalog, String> {
        let at = text.rfind("sum ").ok_or("no sum line")?;
        let (body, sum) = text.split_at(at);
        let sum = u64::from_str_radix(sum.trim_start_matches("sum ").trim_end(), 16)
            .map_err(|_| "bad sum line")?;
        if xxh3_64(body.as_bytes()) != sum {
            return Err("checksum mismatch".into());
        }
        let mut lines = body.lines();
        let mut field = |key: &str| -> Result<String, String> {
            let line = lines.next().ok_or(format!("missing {key}"))?;
            line.strip_prefix(key)
                .and_then(|v| v.strip_prefix(' ').or(Some(v).filter(|v| v.is_empty())))
                .map(str::to_owned)
                .ok_or(format!("expected {key}, found {line:?}"))
        };
        if field("ramgrid-catalog")? != "1" {
            return Err("unknown catalog format version".into());
        }
        let num = |v: String, key: &str| v.parse::<u32>().map_err(|_| format!("bad {key}"));
        let name = decode_name(&field("name")?).ok_or("bad name")?;
        let incarnation =
            u64::from_str_radix(&field("incarnation")?, 16).map_err(|_| "bad incarnation")?;
        let partitions = num(field("partitions")?, "partitions")?;
        let replication = num(field("replication")?, "replication")?;
        let value_type = parse_value_type(&field("value_type")?).ok_or("bad value_type")?;
        let high_water = num(field("high_water")?, "high_water")?;
        let current = num(field("current")?, "current")?;
        let sealed = field("sealed")?
            .split_whitespace()
            .map(|v| v.parse::<u32>().map_err(|_| "bad sealed list".to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Catalog {
            spec: TableSpec {
                name,
                partitions,
                replication,
                value_type,
                durability: Durability::Snapshot,
                incarnation,
            },
            high_water,
            current,
            sealed,
        })
    }
}

/// Write `bytes` to `path` so that a crash leaves the old file or the whole new one: a `.tmp`
/// file, fsync, rename, fsync of the directory.
fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, path)?;
    sync_dir(path.parent().expect("files live in a directory"))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn io_msg(what: &str, path: &Path, e: io::Error) -> String {
    format!("{what} {}: {e}", path.display())
}

/// One table loaded at start, for the log line.
#[derive(Debug)]
pub struct Loaded {
    /// Table name.
    pub name: String,
    /// Versions installed.
    pub versions: Vec<u32>,
    /// Keys loaded.
    pub items: u64,
    /// Image bytes read.
    pub bytes: u64,
    /// Partitions refused (file missing or failed validation), as (version, partition).
    pub missing: Vec<(u32, u32)>,
    /// Time to read, validate and install everything, in seconds.
    pub seconds: f64,
}

impl Persist {
    /// Use (and create) `dir` as the data directory.
    pub fn open(dir: &Path) -> Result<Persist, String> {
        let tables_dir = dir.join("tables");
        fs::create_dir_all(&tables_dir).map_err(|e| io_msg("cannot create", &tables_dir, e))?;
        Ok(Persist { tables_dir })
    }

    fn table_dir(&self, spec: &TableSpec) -> PathBuf {
        self.tables_dir.join(format!(
            "{}-{:016x}",
            encode_name(&spec.name),
            spec.incarnation
        ))
    }

    /// The catalog of `name` as the registry holds it now, with `also_sealed` counted as sealed
    /// (a version whose images were just written, about to be marked sealed). `None` for a table
    /// whose durability is memory.
    fn catalog(&self, tables: &Tables, name: &str, also_sealed: Option<u32>) -> Option<Catalog> {
        let info = tables.describe(name).ok()?;
        if info.spec.durability != Durability::Snapshot {
            return None;
        }
        let sealed: Vec<u32> = info
            .versions
            .iter()
            .filter(|v| v.sealed || Some(v.number) == also_sealed)
            .map(|v| v.number)
            .collect();
        let current = if sealed.contains(&info.current) {
            info.current
        } else {
            0
        };
        Some(Catalog {
            spec: info.spec,
            high_water: info.high_water,
            current,
            sealed,
        })
    }

    fn write_catalog(&self, c: &Catalog) -> Result<(), String> {
        let dir = self.table_dir(&c.spec);
        fs::create_dir_all(&dir).map_err(|e| io_msg("cannot create", &dir, e))?;
        let path = dir.join("catalog");
        write_atomic(&path, c.to_text().as_bytes())
            .map_err(|e| io_msg("cannot write", &path, e))?;
        sync_dir(&self.tables_dir).map_err(|e| io_msg("cannot sync", &self.tables_dir, e))
    }

    /// Rewrite `name`'s catalog after a change to its versions (create, set-current, drop).
    /// Nothing for a memory table.
    pub fn sync_table(&self, tables: &Tables, name: &str) -> Result<(), String> {
        match self.catalog(tables, name, None) {
            Some(c) => self.write_catalog(&c),
            None => Ok(()),
        }
    }

    /// SEAL of a snapshot table: freeze the version, write each held partition's image, list the
    /// version in the catalog, and only then mark it sealed. On an error the version is not
    /// sealed (it takes no more writes; a SEAL may be retried) and the error says what failed.
    /// A memory table is sealed as usual.
    pub fn seal(&self, tables: &Tables, name: &str, version: u32) -> Result<(), SealError> {
        let spec = tables.describe(name).map_err(SealError::Store)?.spec;
        if spec.durability != Durability::Snapshot {
            return tables.seal_version(name, version).map_err(SealError::Store);
        }
        let tv = tables
            .freeze_version(name, version)
            .map_err(SealError::Store)?;
        if !tv.is_sealed() {
            let vdir = self.table_dir(&spec).join(format!("v{version}"));
            fs::create_dir_all(&vdir)
                .map_err(|e| SealError::Disk(io_msg("cannot create", &vdir, e)))?;
            for p in (0..spec.partitions).filter(|&p| tv.is_held(p)) {
                let img = tv.partition_image(p).map_err(SealError::Store)?;
                let path = vdir.join(format!("p{p}.img"));
                write_atomic(&path, &img)
                    .map_err(|e| SealError::Disk(io_msg("cannot write", &path, e)))?;
            }
            let parent = vdir.parent().expect("version dirs live in a table dir");
            sync_dir(parent).map_err(|e| SealError::Disk(io_msg("cannot sync", parent, e)))?;
            let c = self
                .catalog(tables, name, Some(version))
                .expect("a snapshot table has a catalog");
            self.write_catalog(&c).map_err(SealError::Disk)?;
        }
        tables.seal_version(name, version).map_err(SealError::Store)
    }

    /// After DROP_VERSION: the catalog first (so a crash cannot list a version whose files are
    /// going), then the version's files.
    pub fn drop_version(&self, tables: &Tables, name: &str, version: u32) -> Result<(), String> {
        let Some(c) = self.catalog(tables, name, None) else {
            return Ok(());
        };
        self.write_catalog(&c)?;
        let vdir = self.table_dir(&c.spec).join(format!("v{version}"));
        match fs::remove_dir_all(&vdir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_msg("cannot remove", &vdir, e)),
        }
    }

    /// Before DROP_TABLE of a table with this spec: its directory goes (renamed away first, so
    /// a crash leaves no catalog behind). A refusal here leaves the table in place.
    pub fn drop_table(&self, spec: &TableSpec) -> Result<(), String> {
        if spec.durability != Durability::Snapshot {
            return Ok(());
        }
        let dir = self.table_dir(spec);
        let gone = dir.with_extension("dropped");
        match fs::rename(&dir, &gone) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_msg("cannot remove", &dir, e)),
        }
        sync_dir(&self.tables_dir).map_err(|e| io_msg("cannot sync", &self.tables_dir, e))?;
        fs::remove_dir_all(&gone).map_err(|e| io_msg("cannot remove", &gone, e))
    }

    /// Load every table of the data directory into `tables`, holding the partitions `held`
    /// says. Problems are reported through `warn` and never stop the others: a catalog that does
    /// not parse skips its table, an image that fails validation leaves its partition missing
    /// (refused as not held, never read as empty), a second incarnation of a loaded name is
    /// ignored.
    pub fn load(
        &self,
        tables: &Tables,
        held: impl Fn(&TableSpec) -> Vec<u32>,
        mut warn: impl FnMut(String),
    ) -> Vec<Loaded> {
        let mut dirs: Vec<PathBuf> = match fs::read_dir(&self.tables_dir) {
            Ok(rd) => rd.filter_map(|e| e.ok()).map(|e| e.path()).collect(),
            Err(e) => {
                warn(io_msg("cannot read", &self.tables_dir, e));
                return Vec::new();
            }
        };
        dirs.sort();
        let mut out = Vec::new();
        for dir in dirs {
            if !dir.is_dir() || dir.extension().is_some_and(|x| x == "dropped") {
                continue;
            }
            let path = dir.join("catalog");
            let catalog = match fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|t| Catalog::parse(&t))
            {
                Ok(c) => c,
                Err(e) => {
                    warn(format!("{}: {e}; table not loaded", path.display()));
                    continue;
                }
            };
            if dir != self.table_dir(&catalog.spec) {
                warn(format!(
                    "{}: catalog is for table {:?} incarnation {:016x}, not this directory; ignored",
                    dir.display(),
                    catalog.spec.name,
                    catalog.spec.incarnation
                ));
                continue;
            }
            if let Ok(other) = tables.describe(&catalog.spec.name) {
                warn(format!(
                    "{}: table {:?} is already loaded with incarnation {:016x}; this incarnation \
                     ({:016x}) is ignored",
                    dir.display(),
                    catalog.spec.name,
                    other.spec.incarnation,
                    catalog.spec.incarnation
                ));
                continue;
            }
            match self.load_table(tables, &dir, &catalog, &held(&catalog.spec), &mut warn) {
                Ok(l) => out.push(l),
                Err(e) => {
                    let _ = tables.drop_table(&catalog.spec.name);
                    warn(format!("{}: {e}; table not loaded", dir.display()));
                }
            }
        }
        out
    }

    fn load_table(
        &self,
        tables: &Tables,
        dir: &Path,
        c: &Catalog,
        held: &[u32],
        warn: &mut impl FnMut(String),
    ) -> Result<Loaded, String> {
        let started = Instant::now();
        let name = &c.spec.name;
        tables
            .create_table(c.spec.clone(), held)
            .map_err(|e| e.to_string())?;
        // create_table makes an open version 1; open versions are not kept across a restart.
        tables
            .drop_version(name, 1, true)
            .map_err(|e| e.to_string())?;
        let (mut bytes, mut missing) = (0u64, Vec::new());
        for &v in &c.sealed {
            let vdir = dir.join(format!("v{v}"));
            let mut images = Vec::new();
            let mut lost = Vec::new();
            for p in 0..c.spec.partitions {
                let path = vdir.join(format!("p{p}.img"));
                match fs::read(&path) {
                    Ok(img) => images.push((p, img)),
                    Err(e) => {
                        if held.contains(&p) {
                            warn(io_msg("cannot read", &path, e) + "; partition refused");
                        }
                        lost.push(p);
                    }
                }
            }
            bytes += images.iter().map(|(_, i)| i.len() as u64).sum::<u64>();
            let refs: Vec<(u32, &[u8])> = images.iter().map(|(p, i)| (*p, &i[..])).collect();
            let mut refused = Vec::new();
            tables
                .install_version_with(name, v, &refs, &lost, |p, e: &StoreError| {
                    warn(format!(
                        "{}: {e}; partition refused",
                        vdir.join(format!("p{p}.img")).display()
                    ));
                    refused.push(p);
                    true
                })
                .map_err(|e| format!("version {v}: {e}"))?;
            lost.extend(refused);
            missing.extend(lost.iter().filter(|p| held.contains(p)).map(|&p| (v, p)));
        }
        if c.current != 0 {
            tables
                .set_current(name, c.current)
                .map_err(|e| format!("current version {}: {e}", c.current))?;
        }
        tables
            .raise_high_water(name, c.high_water)
            .map_err(|e| e.to_string())?;
        let info = tables.describe(name).map_err(|e| e.to_string())?;
        Ok(Loaded {
            name: name.clone(),
            versions: c.sealed.clone(),
            items: info.versions.iter().map(|v| v.items).sum(),
            bytes,
            missing,
            seconds: started.elapsed().as_secs_f64(),
        })
    }
}

/// Why a SEAL of a snapshot table failed.
#[derive(Debug)]
pub enum SealError {
    /// The store refused (no such table or version, ...).
    Store(StoreError),
    /// Writing the snapshot failed (disk full, permission): the version is not sealed.
    Disk(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_text_round_trips_and_detects_damage() {
        let c = Catalog {
            spec: TableSpec {
                name: "a/../b c%".into(),
                partitions: 8,
                replication: 2,
                value_type: ValueType::F32Vec { dim: 4 },
                durability: Durability::Snapshot,
                incarnation: 0xdead_beef,
            },
            high_water: 5,
            current: 3,
            sealed: vec![2, 3],
        };
        let text = c.to_text();
        assert_eq!(Catalog::parse(&text), Ok(c.clone()));
        assert!(!encode_name(&c.spec.name).contains('/'));
        assert!(!encode_name(&c.spec.name).contains('.'));
        let bad = text.replace("current 3", "current 2");
        assert!(Catalog::parse(&bad).unwrap_err().contains("checksum"));
        assert!(Catalog::parse(&text[..text.len() - 5]).is_err());
        let empty = Catalog {
            sealed: vec![],
            ..c
        };
        assert_eq!(Catalog::parse(&empty.to_text()), Ok(empty));
    }
}
