//! Durable tables on a server started with `--data-dir`: every sealed version of a table created
//! with `durability = snapshot` or `log` is written as partition images (docs/partition-image.md)
//! before SEAL is acknowledged, a small catalog per table follows every admin change, and a
//! restarting server loads both before it accepts connections. A `log` table's open versions each
//! have a write-ahead log (wal.rs) that the restart replays after the images.
//!
//! Layout under the data directory (docs/durability.md):
//!
//! ```text
//! DIR/tables/<name>-<incarnation as 16 hex digits>/catalog      the catalog (text, below)
//! DIR/tables/<name>-<incarnation>/v<version>/p<partition>.img  one image per held partition
//! DIR/tables/<name>-<incarnation>/v<version>.log               log of an open version (log tables)
//! DIR/tables/<name>-<incarnation>/v<version>.log.corrupt       a damaged log, set aside (kept to inspect)
//! DIR/tables/<name>-<incarnation>/v<version>.copying           the log was restarted after damage:
//!                                                              the version must be copied from a replica
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
//! ramgrid-catalog 2
//! name <encoded name>
//! incarnation <16 hex>
//! partitions <n>
//! replication <n>
//! value_type bytes | i64 | f64 | f32x<dim>
//! durability snapshot | log
//! high_water <n>
//! current <n, 0 = none or an open version>
//! sealed <v> <v> ...
//! sum <16 hex>
//! ```
//!
//! Format 1 (written before log tables existed) has no `durability` line and means snapshot; it
//! is still read.
//!
//! File I/O here is blocking and runs on the worker thread that handles the admin request: admin
//! requests are rare, and a SEAL must not be answered before its images are on disk anyway.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ramgrid_store::tables::{Durability, KeyStatus, TableSpec, TableVersion, Tables, ValueType};
use ramgrid_store::Error as StoreError;
use xxhash_rust::xxh3::xxh3_64;

use ramgrid_proto::native::ErrorReply;

use crate::convert::disk_refusal;
use crate::node::Node;
use crate::wal::{self, Log, Logs, Op};

/// What a server with `--data-dir` keeps on disk.
#[derive(Debug)]
pub struct Persist {
    tables_dir: PathBuf,
    /// The write-ahead logs of the open versions of log tables.
    logs: Logs,
}

/// A table's catalog, as written and as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Catalog {
    /// The table's spec (durability snapshot or log: memory tables have no catalog).
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
        let durability = match s.durability {
            Durability::Log => "log",
            _ => "snapshot",
        };
        let body = format!(
            "ramgrid-catalog 2\nname {}\nincarnation {:016x}\npartitions {}\nreplication {}\n\
             value_type {}\ndurability {durability}\nhigh_water {}\ncurrent {}\nsealed {}\n",
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
        let format = field("ramgrid-catalog")?;
        if format != "1" && format != "2" {
            return Err(format!("unknown catalog format version {format:?}"));
        }
        let num = |v: String, key: &str| v.parse::<u32>().map_err(|_| format!("bad {key}"));
        let name = decode_name(&field("name")?).ok_or("bad name")?;
        let incarnation =
            u64::from_str_radix(&field("incarnation")?, 16).map_err(|_| "bad incarnation")?;
        let partitions = num(field("partitions")?, "partitions")?;
        let replication = num(field("replication")?, "replication")?;
        let value_type = parse_value_type(&field("value_type")?).ok_or("bad value_type")?;
        let durability = if format == "1" {
            Durability::Snapshot
        } else {
            match field("durability")?.as_str() {
                "snapshot" => Durability::Snapshot,
                "log" => Durability::Log,
                _ => return Err("bad durability".into()),
            }
        };
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
                durability,
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
    /// Open versions replayed from their write-ahead logs (log tables).
    pub replayed: Vec<u32>,
    /// Of `replayed`, those whose log was damaged (now or at an earlier start, before a copy
    /// completed): what is here is incomplete and must be copied from a replica.
    pub copying: Vec<u32>,
    /// Log bytes read and records replayed.
    pub log_bytes: u64,
    /// Records replayed.
    pub log_records: u64,
    /// Time to read, validate and install everything, in seconds.
    pub seconds: f64,
}

impl Node {
    /// Rewrite a table's catalog in the data directory, if there is one and the table is durable.
    pub(crate) fn sync_catalog(&self, name: &str) -> Result<(), ErrorReply> {
        match &self.persist {
            Some(p) => p.sync_table(&self.tables, name).map_err(disk_refusal),
            None => Ok(()),
        }
    }

    /// The write-ahead log a write to `tv` must go through (log tables on a server with a data
    /// directory); a failed log refuses the write before anything is applied.
    pub(crate) fn log_of(&self, tv: &TableVersion) -> Result<Option<Arc<Log>>, ErrorReply> {
        match &self.persist {
            Some(p) => p.log_of(tv).map_err(disk_refusal),
            None => Ok(None),
        }
    }
}

impl Persist {
    /// Use (and create) `dir` as the data directory.
    pub fn open(dir: &Path) -> Result<Persist, String> {
        let tables_dir = dir.join("tables");
        fs::create_dir_all(&tables_dir).map_err(|e| io_msg("cannot create", &tables_dir, e))?;
        Ok(Persist {
            tables_dir,
            logs: Logs::default(),
        })
    }

    fn log_path(&self, spec: &TableSpec, version: u32) -> PathBuf {
        self.table_dir(spec).join(format!("v{version}.log"))
    }

    /// The mark left while a version whose log was damaged waits for its copy from a replica.
    fn copying_path(&self, spec: &TableSpec, version: u32) -> PathBuf {
        self.table_dir(spec).join(format!("v{version}.copying"))
    }

    /// Every held partition of open version `version` has been copied from a replica: its log
    /// now holds the whole version, and a restart may serve its replay again.
    pub fn copy_done(&self, spec: &TableSpec, version: u32) -> Result<(), String> {
        let path = self.copying_path(spec, version);
        match fs::remove_file(&path) {
            Ok(()) => {
                tracing::info!(
                    "data dir: {}: version {version} of {:?} copied whole from replicas; its log is complete again",
                    path.display(),
                    spec.name
                );
                sync_dir(&self.table_dir(spec)).map_err(|e| io_msg("cannot sync", &path, e))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_msg("cannot remove", &path, e)),
        }
    }

    /// A partition of sealed version `version` copied from a replica (a repair, a move): its
    /// image is written where a seal would have written it, so the next restart loads it instead
    /// of copying it again (or, with no replica up, refusing it). Nothing for a memory table.
    pub fn store_image(
        &self,
        spec: &TableSpec,
        version: u32,
        partition: u32,
        image: &[u8],
    ) -> Result<(), String> {
        if spec.durability == Durability::Memory {
            return Ok(());
        }
        let vdir = self.table_dir(spec).join(format!("v{version}"));
        fs::create_dir_all(&vdir).map_err(|e| io_msg("cannot create", &vdir, e))?;
        let path = vdir.join(format!("p{partition}.img"));
        write_atomic(&path, image).map_err(|e| io_msg("cannot write", &path, e))
    }

    /// A damaged log of version `v`: marks the version as waiting for a copy, sets the file
    /// aside (`.log.corrupt`, kept for inspection) and starts an empty log in its place, which
    /// takes the writes made meanwhile and the copy. In this order, so that a crash at any step
    /// leaves either the damaged log (refused again) or the mark (the replay is never served
    /// as whole).
    fn restart_log(&self, spec: &TableSpec, v: u32, path: &Path) -> Result<Log, String> {
        let mark = self.copying_path(spec, v);
        let dir = self.table_dir(spec);
        write_atomic(&mark, b"copy this version from a replica\n")
            .map_err(|e| io_msg("cannot write", &mark, e))?;
        let aside = path.with_extension("log.corrupt");
        fs::rename(path, &aside).map_err(|e| io_msg("cannot rename", path, e))?;
        sync_dir(&dir).map_err(|e| io_msg("cannot sync", &dir, e))?;
        Log::create(path, v, spec.incarnation).map_err(|e| io_msg("cannot create", path, e))
    }

    /// The write-ahead log a PUT or DELETE of `tv` must append to and commit before it is
    /// acknowledged: `None` unless the table's durability is log; `Err` (the write is refused
    /// before anything is applied) if the version has no log or its log has failed.
    pub fn log_of(&self, tv: &TableVersion) -> Result<Option<Arc<Log>>, String> {
        let spec = tv.spec();
        if spec.durability != Durability::Log {
            return Ok(None);
        }
        match self.logs.get(&spec.name, spec.incarnation, tv.version()) {
            Some(log) => log.check().map(|()| Some(log)),
            None => Err(format!(
                "version {} of table {:?} has no write-ahead log ({} could not be created or \
                 read back)",
                tv.version(),
                spec.name,
                self.log_path(spec, tv.version()).display()
            )),
        }
    }

    /// Give every open version of a log table a log (a new table's version 1, a new version):
    /// created and fsynced before the catalog that lists the version's number is written. A log
    /// refused at restart (kept for inspection) is left alone, and its version keeps refusing
    /// writes; any other file in the way is an error (the version is not created).
    fn ensure_logs(&self, tables: &Tables, name: &str) -> Result<(), String> {
        let Ok(info) = tables.describe(name) else {
            return Ok(());
        };
        let spec = &info.spec;
        if spec.durability != Durability::Log {
            return Ok(());
        }
        let dir = self.table_dir(spec);
        fs::create_dir_all(&dir).map_err(|e| io_msg("cannot create", &dir, e))?;
        for v in info.versions.iter().filter(|v| !v.sealed) {
            if self.logs.known(name, spec.incarnation, v.number) {
                continue;
            }
            let path = self.log_path(spec, v.number);
            let log = Log::create(&path, v.number, spec.incarnation)
                .map_err(|e| io_msg("cannot create", &path, e))?;
            self.logs.insert(name, spec.incarnation, log);
        }
        Ok(())
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
        if info.spec.durability == Durability::Memory {
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
        // One writer at a time: a worker's admin request and the repair thread may both rewrite
        // a catalog, and they share its temporary name.
        static WRITING: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
        let _one = WRITING.lock();
        let dir = self.table_dir(&c.spec);
        fs::create_dir_all(&dir).map_err(|e| io_msg("cannot create", &dir, e))?;
        let path = dir.join("catalog");
        write_atomic(&path, c.to_text().as_bytes())
            .map_err(|e| io_msg("cannot write", &path, e))?;
        sync_dir(&self.tables_dir).map_err(|e| io_msg("cannot sync", &self.tables_dir, e))
    }

    /// Rewrite `name`'s catalog after a change to its versions (create, set-current, drop),
    /// first creating the logs of a log table's new open versions. Nothing for a memory table.
    pub fn sync_table(&self, tables: &Tables, name: &str) -> Result<(), String> {
        self.ensure_logs(tables, name)?;
        match self.catalog(tables, name, None) {
            Some(c) => self.write_catalog(&c),
            None => Ok(()),
        }
    }

    /// SEAL of a snapshot or log table: freeze the version, write each held partition's image,
    /// list the version in the catalog, and only then mark it sealed; a log table's log of the
    /// version is removed after that (its images hold everything it did). On an error the
    /// version is not sealed (it takes no more writes; a SEAL may be retried) and the error says
    /// what failed. A memory table is sealed as usual.
    pub fn seal(&self, tables: &Tables, name: &str, version: u32) -> Result<(), SealError> {
        let spec = tables.describe(name).map_err(SealError::Store)?.spec;
        if spec.durability == Durability::Memory {
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
        tables
            .seal_version(name, version)
            .map_err(SealError::Store)?;
        if spec.durability == Durability::Log {
            // Best effort: a log left behind names a sealed version, and the next restart
            // deletes it unread.
            let path = self.log_path(&spec, version);
            let _ = self.logs.remove(name, spec.incarnation, version, &path);
            let _ = fs::remove_file(self.copying_path(&spec, version));
        }
        Ok(())
    }

    /// After DROP_VERSION: the catalog first (so a crash cannot list a version whose files are
    /// going), then the version's files.
    pub fn drop_version(&self, tables: &Tables, name: &str, version: u32) -> Result<(), String> {
        let Some(c) = self.catalog(tables, name, None) else {
            return Ok(());
        };
        self.write_catalog(&c)?;
        if c.spec.durability == Durability::Log {
            let path = self.log_path(&c.spec, version);
            self.logs
                .remove(name, c.spec.incarnation, version, &path)
                .map_err(|e| io_msg("cannot remove", &path, e))?;
            for gone in [
                self.copying_path(&c.spec, version),
                path.with_extension("log.corrupt"),
            ] {
                match fs::remove_file(&gone) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_msg("cannot remove", &gone, e)),
                }
            }
        }
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
        if spec.durability == Durability::Memory {
            return Ok(());
        }
        self.logs.forget_table(&spec.name, spec.incarnation);
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
        let logs = if c.spec.durability == Durability::Log {
            self.find_logs(dir, c, warn)
        } else {
            Vec::new()
        };
        // create_table makes an open version 1 (current); it stays only if its log does, to be
        // replayed below. Other open versions are not kept across a restart.
        if !logs.contains(&1) {
            tables
                .drop_version(name, 1, true)
                .map_err(|e| e.to_string())?;
        }
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
        let (mut log_bytes, mut log_records) = (0, 0);
        let mut copying = Vec::new();
        for &v in &logs {
            let path = self.log_path(&c.spec, v);
            if self.copying_path(&c.spec, v).exists() {
                copying.push(v);
            }
            match self.replay(tables, c, v, &path, warn) {
                Ok((b, r)) => {
                    log_bytes += b;
                    log_records += r;
                }
                Err(e) => {
                    let all: Vec<u32> = (0..c.spec.partitions).collect();
                    let _ = tables.drop_version(name, v, true);
                    tables
                        .restore_open_version(name, v, &all)
                        .map_err(|e| format!("version {v}: {e}"))?;
                    if v == 1 && c.current == 0 {
                        // The mutable head of a table never switched: current, as it was (its
                        // partitions are refused until copied, so nothing is read short).
                        tables
                            .adopt_current(name, 1)
                            .map_err(|e| format!("version 1: {e}"))?;
                    }
                    match self.restart_log(&c.spec, v, &path) {
                        Ok(log) => {
                            warn(format!(
                                "{}: {e}; set aside as {}, version {v} to be copied from a \
                                 replica (its partitions are refused until then)",
                                path.display(),
                                path.with_extension("log.corrupt").display()
                            ));
                            self.logs.insert(name, c.spec.incarnation, log);
                            if !copying.contains(&v) {
                                copying.push(v);
                            }
                        }
                        Err(e2) => {
                            warn(format!(
                                "{}: {e}; version {v} refused (its partitions are missing): \
                                 it cannot be set aside for a copy ({e2})",
                                path.display()
                            ));
                            self.logs.insert_refused(name, c.spec.incarnation, v);
                            copying.retain(|&x| x != v);
                        }
                    }
                    missing.extend(held.iter().map(|&p| (v, p)));
                }
            }
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
            replayed: logs,
            copying,
            log_bytes,
            log_records,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// The open versions of a log table that have a log file, ascending. Logs of versions the
    /// catalog lists as sealed (a crash between the seal's catalog write and the log's removal)
    /// and leftover `.log.tmp` files are deleted.
    fn find_logs(&self, dir: &Path, c: &Catalog, warn: &mut impl FnMut(String)) -> Vec<u32> {
        let mut out = Vec::new();
        let entries = match fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) => {
                warn(io_msg("cannot read", dir, e));
                return out;
            }
        };
        for e in entries.filter_map(|e| e.ok()) {
            let file = e.file_name();
            let Some(file) = file.to_str() else { continue };
            if file.ends_with(".log.tmp") {
                let _ = fs::remove_file(e.path());
                continue;
            }
            let Some(v) = file
                .strip_prefix('v')
                .and_then(|f| f.strip_suffix(".log"))
                .and_then(|n| n.parse::<u32>().ok())
                .filter(|&v| v > 0)
            else {
                continue;
            };
            if c.sealed.contains(&v) {
                let _ = fs::remove_file(e.path());
            } else {
                out.push(v);
            }
        }
        out.sort_unstable();
        out
    }

    /// Replay the log of open version `v` (module docs of wal.rs): re-create the version (version
    /// 1 is already there, from create_table), apply every record of a partition this server
    /// holds, cut a torn tail (reported through `warn`), and open the log for further writes.
    /// `Err` for a log that cannot be read, is corrupt, or whose writes the store now refuses
    /// (the caller marks the version missing). Returns (bytes read, records applied).
    fn replay(
        &self,
        tables: &Tables,
        c: &Catalog,
        v: u32,
        path: &Path,
        warn: &mut impl FnMut(String),
    ) -> Result<(u64, u64), String> {
        let name = &c.spec.name;
        let bytes = fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
        let scan = wal::scan(&bytes, v, c.spec.incarnation);
        match &scan.end {
            wal::End::Clean => {}
            wal::End::TornTail { at, bytes } => warn(format!(
                "{}: torn tail of {bytes} bytes at offset {at} (a write cut short by a crash, \
                 never acknowledged); truncated, {} records before it kept",
                path.display(),
                scan.records.len()
            )),
            wal::End::Corrupt { at, what } => return Err(format!("{what} at offset {at}")),
        }
        if v != 1 {
            tables
                .restore_open_version(name, v, &[])
                .map_err(|e| e.to_string())?;
        }
        let tv = tables.at(name, v).map_err(|e| e.to_string())?;
        let vt = c.spec.value_type;
        let mut status = Vec::new();
        let mut applied = 0u64;
        for r in scan.records.iter().filter(|r| tv.is_held(r.partition)) {
            let mut ops = &r.ops[..];
            while let Some(first) = ops.first() {
                let put = matches!(first, Op::Put(..));
                let run = ops
                    .iter()
                    .take_while(|o| matches!(o, Op::Put(..)) == put)
                    .count();
                let (now, rest) = ops.split_at(run);
                ops = rest;
                status.clear();
                let done = if put {
                    let mut items = Vec::with_capacity(now.len());
                    for op in now {
                        let Op::Put(k, val) = *op else { unreachable!() };
                        if vt.packed_width().is_some_and(|w| w != val.len()) {
                            return Err(format!(
                                "a value of {} bytes in partition {} is not a {vt:?}",
                                val.len(),
                                r.partition
                            ));
                        }
                        items.push((k, crate::convert::value_ref(vt, val)));
                    }
                    tv.put_batch(r.partition, items, &mut status)
                } else {
                    let keys = now.iter().map(|o| match *o {
                        Op::Delete(k) | Op::Put(k, _) => k,
                    });
                    tv.delete_batch(r.partition, keys, &mut status)
                };
                done.map_err(|e| format!("partition {}: {e}", r.partition))?;
                let ok =
                    |&s: &u8| s == KeyStatus::Ok as u8 || (!put && s == KeyStatus::NotFound as u8);
                if let Some(bad) = status.iter().find(|s| !ok(s)) {
                    return Err(format!(
                        "partition {}: a logged write is refused now ({:?})",
                        r.partition,
                        KeyStatus::from_u8(*bad)
                    ));
                }
            }
            applied += 1;
        }
        let log = Log::reopen(path, v, scan.good_len).map_err(|e| e.to_string())?;
        self.logs.insert(name, c.spec.incarnation, log);
        Ok((bytes.len() as u64, applied))
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
            ..c.clone()
        };
        assert_eq!(Catalog::parse(&empty.to_text()), Ok(empty));
        let mut log = c.clone();
        log.spec.durability = Durability::Log;
        assert_eq!(Catalog::parse(&log.to_text()), Ok(log.clone()));
        assert!(log.to_text().contains("\ndurability log\n"));
        // Format 1 (no durability line) is still read, as snapshot.
        let body = c
            .to_text()
            .replace("ramgrid-catalog 2", "ramgrid-catalog 1")
            .replace("durability snapshot\n", "");
        let body = &body[..body.rfind("sum ").unwrap()];
        let v1 = format!("{body}sum {:016x}\n", xxh3_64(body.as_bytes()));
        assert_eq!(Catalog::parse(&v1), Ok(c));
    }

    /// Writes the fuzz target's seeds: `cargo test -p ramgrid-server --lib write_fuzz_seeds --
    /// -- --ignored` (to fuzz/seeds/catalog/). Catalogs of each value type and durability, a
    /// format 1 one, and damaged ones.
    #[test]
    #[ignore = "writes files; run by hand to refresh the fuzz seeds"]
    fn write_fuzz_seeds() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/seeds/catalog");
        fs::create_dir_all(dir).unwrap();
        let write = |name: &str, text: &str| fs::write(format!("{dir}/{name}"), text).unwrap();
        let types = [
            ValueType::Bytes,
            ValueType::I64,
            ValueType::F64,
            ValueType::F32Vec { dim: 768 },
        ];
        let names = ["emb", "a/../b c%", "t\u{e9}_-9", ""];
        for (n, (t, name)) in types.into_iter().zip(names).enumerate() {
            let c = Catalog {
                spec: TableSpec {
                    name: name.into(),
                    partitions: 1 << n,
                    replication: n as u32 + 1,
                    value_type: t,
                    durability: if n % 2 == 0 {
                        Durability::Snapshot
                    } else {
                        Durability::Log
                    },
                    incarnation: 0x0123_4567_89ab_cdef_u64.rotate_left(n as u32 * 8),
                },
                high_water: 3 * n as u32,
                current: n as u32,
                sealed: (1..=n as u32).collect(),
            };
            let text = c.to_text();
            assert_eq!(Catalog::parse(&text), Ok(c));
            write(&format!("catalog{n}"), &text);
        }
        let text = fs::read_to_string(format!("{dir}/catalog2")).unwrap();
        let body = text
            .replace("ramgrid-catalog 2", "ramgrid-catalog 1")
            .replace("durability snapshot\n", "");
        let body = &body[..body.rfind("sum ").unwrap()];
        write(
            "format1",
            &format!("{body}sum {:016x}\n", xxh3_64(body.as_bytes())),
        );
        write("bad-sum", &text.replace("current 2", "current 3"));
        write("cut", &text[..text.len() - 9]);
    }
}
