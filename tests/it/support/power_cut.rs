//! A power-loss simulator: a filesystem kept in memory (FUSE, through the `fuser` crate)
//! that forgets, when the power is cut, what a machine losing power may forget, as
//! LazyFS does for Jepsen:
//!
//! - the changes made to files since their last `fsync` or `fdatasync`, but those made
//!   before a random instant between the first of them and the cut: the disk got the
//!   kernel's writeback in order up to then, the last write perhaps only in part (a write
//!   over several pages can be torn between them);
//! - every name made, renamed or removed in a directory since that directory's last
//!   `fsync` (so a new file whose directory was never synced is gone, its data with it).
//!
//! Nothing but `fsync` and `fsyncdir` asks for stability (`sync_file_range` and `close`
//! never reach a FUSE filesystem as such requests). A cut does not reorder writes, as a
//! device's volatile cache may: sled 0.34 was seen failing to open after a cut that kept a
//! random half of the unsynced pages (docs/testing.md). A cut unmounts the
//! filesystem (the kernel's caches of it go), drops the unsynced state and mounts it
//! again. The program using it must be dead by then, as it would be on a machine that
//! lost power. Syncs can also be made to fail (`EIO`), as a failing disk's do: the pages
//! the sync could not write are gone, while the kernel, which keeps a file's pages cached
//! across opens here as on a disk, may still serve them until told to drop them.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};

const PAGE: u64 = 4096;
/// How long the kernel may keep names and attributes: it sees every change, as the only
/// way in, and a cut remounts.
const TTL: Duration = Duration::from_secs(60);
const ROOT: u64 = 1;
/// The kernel keeps a file's pages cached across opens, as it does on a disk's filesystem:
/// pages a failed sync lost here stay readable there until dropped.
const KEEP_CACHE: FopenFlags = FopenFlags::FOPEN_KEEP_CACHE;

/// A change of a file since its last sync, numbered in the order of every change made
/// on the filesystem.
#[derive(Clone)]
enum Change {
    /// Bytes written within one page: a write over several pages is several changes, so
    /// that a cut can tear it.
    Wrote {
        at: u64,
        offset: u64,
        bytes: Vec<u8>,
    },
    Truncated {
        at: u64,
        len: u64,
    },
}

impl Change {
    fn at(&self) -> u64 {
        match self {
            Change::Wrote { at, .. } | Change::Truncated { at, .. } => *at,
        }
    }
}

/// A file's bytes: those on "disk" as of its last sync, and the changes made since.
#[derive(Default)]
struct FileData {
    stable: Vec<u8>,
    /// Whole pages written since the last sync, each as the file now reads there.
    pages: BTreeMap<u64, Vec<u8>>,
    len: u64,
    /// `stable`'s bytes from here on read as zeros (a truncation since the last sync).
    zeroed_from: Option<u64>,
    /// The changes since the last sync, in order.
    changes: Vec<Change>,
}

impl FileData {
    fn stable_byte_range(&self, from: u64, to: u64, out: &mut Vec<u8>) {
        let limit = (self.stable.len() as u64).min(self.zeroed_from.unwrap_or(u64::MAX));
        let readable_end = to.min(limit).max(from);
        if from < readable_end {
            out.extend_from_slice(&self.stable[from as usize..readable_end as usize]);
        }
        out.resize(out.len() + (to - readable_end) as usize, 0);
    }

    fn read(&self, offset: u64, size: u64) -> Vec<u8> {
        let end = offset.saturating_add(size).min(self.len);
        let mut out = Vec::with_capacity(end.saturating_sub(offset) as usize);
        let mut at = offset;
        while at < end {
            let page = at / PAGE;
            let until = ((page + 1) * PAGE).min(end);
            match self.pages.get(&page) {
                Some(bytes) => out.extend_from_slice(
                    &bytes[(at - page * PAGE) as usize..(until - page * PAGE) as usize],
                ),
                None => self.stable_byte_range(at, until, &mut out),
            }
            at = until;
        }
        out
    }

    fn page_mut(&mut self, page: u64) -> &mut Vec<u8> {
        if !self.pages.contains_key(&page) {
            let mut bytes = Vec::with_capacity(PAGE as usize);
            self.stable_byte_range(page * PAGE, (page + 1) * PAGE, &mut bytes);
            // Past the end of the file, a page reads as zeros whatever `stable` holds.
            let valid = self.len.saturating_sub(page * PAGE).min(PAGE) as usize;
            bytes[valid..].fill(0);
            self.pages.insert(page, bytes);
        }
        self.pages.get_mut(&page).expect("inserted")
    }

    /// Writes `data` at `offset`, numbering each page's part from `counter`.
    fn write(&mut self, offset: u64, data: &[u8], counter: &mut u64) {
        let mut written = 0;
        while written < data.len() {
            let at = offset + written as u64;
            let page = at / PAGE;
            let within = (at - page * PAGE) as usize;
            let n = (PAGE as usize - within).min(data.len() - written);
            let bytes = self.page_mut(page);
            bytes[within..within + n].copy_from_slice(&data[written..written + n]);
            *counter += 1;
            let part = data[written..written + n].to_vec();
            self.changes.push(Change::Wrote {
                at: *counter,
                offset: at,
                bytes: part,
            });
            written += n;
            self.len = self.len.max(at + n as u64);
        }
    }

    fn truncate(&mut self, len: u64, counter: &mut u64) {
        if len < self.len {
            if !len.is_multiple_of(PAGE) {
                let page = len / PAGE;
                let bytes = self.page_mut(page);
                bytes[(len % PAGE) as usize..].fill(0);
            }
            self.pages.retain(|page, _| page * PAGE < len);
            self.zeroed_from = Some(self.zeroed_from.map_or(len, |from| from.min(len)));
        }
        self.len = len;
        *counter += 1;
        self.changes.push(Change::Truncated { at: *counter, len });
    }

    fn sync(&mut self) {
        if let Some(from) = self.zeroed_from.take() {
            self.stable.truncate(from as usize);
        }
        self.stable.resize(self.len as usize, 0);
        for (page, bytes) in std::mem::take(&mut self.pages) {
            let start = (page * PAGE) as usize;
            let end = (start + PAGE as usize).min(self.len as usize);
            if start < end {
                self.stable[start..end].copy_from_slice(&bytes[..end - start]);
            }
        }
        self.changes.clear();
    }

    /// The earliest change not yet synced.
    fn first_unsynced(&self) -> Option<u64> {
        self.changes.first().map(Change::at)
    }

    /// The power goes: the disk has what was synced, and the changes made since up to
    /// the instant `reached` (the kernel writes back in the background, in order), the
    /// last of them perhaps only in part.
    fn cut(&mut self, reached: u64) {
        let changes = std::mem::take(&mut self.changes);
        let mut disk = FileData {
            len: self.stable.len() as u64,
            stable: std::mem::take(&mut self.stable),
            ..FileData::default()
        };
        let mut unnumbered = 0;
        for change in changes
            .into_iter()
            .take_while(|change| change.at() <= reached)
        {
            match change {
                Change::Wrote { offset, bytes, .. } => disk.write(offset, &bytes, &mut unnumbered),
                Change::Truncated { len, .. } => disk.truncate(len, &mut unnumbered),
            }
        }
        disk.sync();
        *self = disk;
    }

    /// A sync failed: the pages it could not write are gone, as the kernel drops them
    /// (a program that read them from its cache reads stale pages).
    fn lose_unsynced(&mut self) {
        self.cut(0);
    }
}

/// A directory's names now, and as of its last sync.
#[derive(Default)]
struct DirData {
    entries: BTreeMap<OsString, u64>,
    stable: BTreeMap<OsString, u64>,
    parent: u64,
}

enum Node {
    File(FileData),
    Dir(DirData),
}

#[derive(Default)]
struct State {
    nodes: HashMap<u64, Node>,
    next: u64,
    fail_syncs: bool,
    /// Changes made so far: the number of the last.
    changes: u64,
    /// How long each sync takes, as a slow device's cache flush would.
    sync_delay: Duration,
    syncs: u64,
    cuts: u64,
}

impl State {
    fn new() -> State {
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node::Dir(DirData {
                parent: ROOT,
                ..DirData::default()
            }),
        );
        State {
            nodes,
            next: ROOT + 1,
            ..State::default()
        }
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let (kind, size, perm, nlink) = match self.nodes.get(&ino)? {
            Node::File(file) => (FileType::RegularFile, file.len, 0o644, 1),
            Node::Dir(_) => (FileType::Directory, 0, 0o755, 2),
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: SystemTime::UNIX_EPOCH,
            mtime: SystemTime::UNIX_EPOCH,
            ctime: SystemTime::UNIX_EPOCH,
            crtime: SystemTime::UNIX_EPOCH,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: PAGE as u32,
            flags: 0,
        })
    }

    fn dir(&mut self, ino: u64) -> Result<&mut DirData, Errno> {
        match self.nodes.get_mut(&ino) {
            Some(Node::Dir(dir)) => Ok(dir),
            Some(Node::File(_)) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn file(&mut self, ino: u64) -> Result<&mut FileData, Errno> {
        match self.nodes.get_mut(&ino) {
            Some(Node::File(file)) => Ok(file),
            Some(Node::Dir(_)) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn make(&mut self, parent: u64, name: &OsStr, node: Node) -> Result<FileAttr, Errno> {
        let ino = self.next;
        let dir = self.dir(parent)?;
        if dir.entries.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        dir.entries.insert(name.to_owned(), ino);
        self.next += 1;
        self.nodes.insert(ino, node);
        Ok(self.attr(ino).expect("just made"))
    }

    /// The power goes at a random instant between the first change not synced and now:
    /// every directory back to its synced names, every file to its synced bytes and the
    /// changes made before that instant, and what no synced name reaches is gone.
    fn cut(&mut self) {
        let first = (self.nodes.values())
            .filter_map(|node| match node {
                Node::File(file) => file.first_unsynced(),
                Node::Dir(_) => None,
            })
            .min();
        let reached = first.map_or(0, |first| rand::random_range(first - 1..=self.changes));
        for node in self.nodes.values_mut() {
            match node {
                Node::File(file) => file.cut(reached),
                Node::Dir(dir) => dir.entries = dir.stable.clone(),
            }
        }
        let mut reachable = vec![ROOT];
        let mut kept = HashMap::new();
        while let Some(ino) = reachable.pop() {
            let Some(node) = self.nodes.remove(&ino) else {
                continue;
            };
            if let Node::Dir(dir) = &node {
                reachable.extend(dir.entries.values().copied());
            }
            kept.insert(ino, node);
        }
        self.nodes = kept;
        self.cuts += 1;
    }
}

/// The filesystem as fuser serves it: one state behind a lock.
struct PowerCutFs {
    state: Arc<Mutex<State>>,
}

impl PowerCutFs {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }
}

impl Filesystem for PowerCutFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut state = self.state();
        let found = state
            .dir(parent.0)
            .and_then(|dir| dir.entries.get(name).copied().ok_or(Errno::ENOENT));
        match found.map(|ino| state.attr(ino)) {
            Ok(Some(attr)) => reply.entry(&TTL, &attr, Generation(0)),
            Ok(None) => reply.error(Errno::ENOENT),
            Err(error) => reply.error(error),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.state().attr(ino.0) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut state = self.state();
        if let Some(size) = size {
            let mut counter = state.changes;
            match state.file(ino.0) {
                Ok(file) => file.truncate(size, &mut counter),
                Err(error) => return reply.error(error),
            }
            state.changes = counter;
        }
        match state.attr(ino.0) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let dir = Node::Dir(DirData {
            parent: parent.0,
            ..DirData::default()
        });
        match self.state().make(parent.0, name, dir) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(error) => reply.error(error),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        match self
            .state()
            .make(parent.0, name, Node::File(FileData::default()))
        {
            Ok(attr) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(0),
                FopenFlags::empty(),
            ),
            Err(error) => reply.error(error),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, false, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, true, reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut state = self.state();
        let moved = (|| {
            if flags.contains(RenameFlags::RENAME_EXCHANGE) {
                return Err(Errno::EINVAL);
            }
            let ino = *state
                .dir(parent.0)?
                .entries
                .get(name)
                .ok_or(Errno::ENOENT)?;
            let target = state.dir(newparent.0)?;
            if let Some(existing) = target.entries.get(newname).copied() {
                if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                    return Err(Errno::EEXIST);
                }
                if let Some(Node::Dir(dir)) = state.nodes.get(&existing)
                    && !dir.entries.is_empty()
                {
                    return Err(Errno::ENOTEMPTY);
                }
            }
            state.dir(parent.0)?.entries.remove(name);
            state
                .dir(newparent.0)?
                .entries
                .insert(newname.to_owned(), ino);
            if let Ok(dir) = state.dir(ino) {
                dir.parent = newparent.0;
            }
            Ok(())
        })();
        match moved {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(error),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.state().nodes.contains_key(&ino.0) {
            true => reply.opened(FileHandle(0), KEEP_CACHE),
            false => reply.error(Errno::ENOENT),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.state().file(ino.0) {
            Ok(file) => reply.data(&file.read(offset, u64::from(size))),
            Err(error) => reply.error(error),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut state = self.state();
        let mut counter = state.changes;
        match state.file(ino.0) {
            Ok(file) => {
                file.write(offset, data, &mut counter);
                reply.written(data.len() as u32);
            }
            Err(error) => reply.error(error),
        }
        state.changes = counter;
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // A close keeps nothing.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut state = self.state();
        if state.fail_syncs {
            if let Ok(file) = state.file(ino.0) {
                file.lose_unsynced();
            }
            return reply.error(Errno::EIO);
        }
        // The device is busy meanwhile: nothing else gets through.
        std::thread::sleep(state.sync_delay);
        state.syncs += 1;
        match state.file(ino.0) {
            Ok(file) => {
                file.sync();
                reply.ok();
            }
            Err(error) => reply.error(error),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.state().dir(ino.0) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(error) => reply.error(error),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut state = self.state();
        let listed: Vec<(u64, OsString)> = match state.dir(ino.0) {
            Ok(dir) => {
                let mut listed = vec![(ino.0, ".".into()), (dir.parent, "..".into())];
                listed.extend(dir.entries.iter().map(|(name, ino)| (*ino, name.clone())));
                listed
            }
            Err(error) => return reply.error(error),
        };
        for (index, (child, name)) in listed.into_iter().enumerate().skip(offset as usize) {
            let kind = match state.nodes.get(&child) {
                Some(Node::File(_)) => FileType::RegularFile,
                _ => FileType::Directory,
            };
            if reply.add(INodeNo(child), index as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut state = self.state();
        if state.fail_syncs {
            return reply.error(Errno::EIO);
        }
        state.syncs += 1;
        match state.dir(ino.0) {
            Ok(dir) => {
                dir.stable = dir.entries.clone();
                reply.ok();
            }
            Err(error) => reply.error(error),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(
            1 << 24,
            1 << 23,
            1 << 23,
            1 << 20,
            1 << 19,
            PAGE as u32,
            255,
            PAGE as u32,
        );
    }
}

impl PowerCutFs {
    fn remove(&self, parent: INodeNo, name: &OsStr, directory: bool, reply: ReplyEmpty) {
        let mut state = self.state();
        let removed = (|| {
            let ino = *state
                .dir(parent.0)?
                .entries
                .get(name)
                .ok_or(Errno::ENOENT)?;
            match (state.nodes.get(&ino), directory) {
                (Some(Node::Dir(dir)), true) if !dir.entries.is_empty() => {
                    return Err(Errno::ENOTEMPTY);
                }
                (Some(Node::Dir(_)), false) => return Err(Errno::EISDIR),
                (Some(Node::File(_)), true) => return Err(Errno::ENOTDIR),
                _ => {}
            }
            // The node stays: a synced name may still reach it after a cut.
            state.dir(parent.0)?.entries.remove(name);
            Ok(())
        })();
        match removed {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(error),
        }
    }
}

/// The simulator mounted at a directory; unmounted when dropped.
pub struct PowerCutMount {
    path: PathBuf,
    state: Arc<Mutex<State>>,
    session: Option<BackgroundSession>,
}

impl PowerCutMount {
    /// Mounts an empty filesystem at `path` (an empty directory).
    pub fn new(path: &Path) -> std::io::Result<PowerCutMount> {
        let mut mount = PowerCutMount {
            path: path.to_path_buf(),
            state: Arc::new(Mutex::new(State::new())),
            session: None,
        };
        mount.mount()?;
        Ok(mount)
    }

    fn mount(&mut self) -> std::io::Result<()> {
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName("power-cut".into()),
            MountOption::Subtype("power-cut".into()),
        ];
        let fs = PowerCutFs {
            state: Arc::clone(&self.state),
        };
        self.session = Some(fuser::spawn_mount(fs, &self.path, &config)?);
        Ok(())
    }

    fn unmount(&mut self) {
        if let Some(session) = self.session.take()
            && let Err(error) = session.umount_and_join()
            // The kernel may end the connection with ECONNABORTED rather than ENODEV when
            // a request was still under way: the unmount itself was done.
            && self.mounted()
        {
            // Still busy (a process of its own left in it): detached, as a reboot would.
            let detached = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.path)
                .status();
            assert!(
                detached.is_ok_and(|status| status.success()),
                "cannot unmount {}: {error}",
                self.path.display()
            );
        }
    }

    /// Whether a filesystem is still mounted at the path: one is while the path's device
    /// differs from its parent's, or cannot be read (a connection ended, not unmounted).
    fn mounted(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        let parent = self.path.parent().expect("a mount point has a parent");
        match (std::fs::metadata(&self.path), std::fs::metadata(parent)) {
            (Ok(path), Ok(parent)) => path.dev() != parent.dev(),
            _ => true,
        }
    }

    /// Cuts the power: forgets what was not synced, as the machine coming back would find
    /// its disk. Whatever used the filesystem must have exited.
    pub fn cut_power(&mut self) {
        self.unmount();
        self.state.lock().unwrap().cut();
        self.mount().expect("mounting again after the cut");
    }

    /// From now on, every `fsync` and `fsyncdir` fails with `EIO` (or succeeds again).
    pub fn fail_syncs(&self, fail: bool) {
        self.state.lock().unwrap().fail_syncs = fail;
    }

    /// From now on, every `fsync` of a file takes `delay`, during which the filesystem
    /// answers nothing else.
    pub fn slow_syncs(&self, delay: Duration) {
        self.state.lock().unwrap().sync_delay = delay;
    }

    /// `fsync`s and `fsyncdir`s that succeeded, since the mount was made.
    pub fn syncs(&self) -> u64 {
        self.state.lock().unwrap().syncs
    }

    /// Whether the filesystem can be mounted here (`/dev/fuse` and the right to mount, as
    /// root): without, a test is skipped with a message, or fails under `CI=true`.
    pub fn usable() -> bool {
        let mounted = Path::new("/dev/fuse").exists()
            && tempfile::tempdir().is_ok_and(|dir| PowerCutMount::new(dir.path()).is_ok());
        if !mounted {
            assert!(
                std::env::var("CI").map_or(true, |ci| ci != "true"),
                "CI must be able to mount a FUSE filesystem (/dev/fuse, as root)"
            );
            eprintln!("skipped: a FUSE filesystem cannot be mounted here (/dev/fuse, root)");
        }
        mounted
    }
}

impl Drop for PowerCutMount {
    fn drop(&mut self) {
        self.unmount();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_written_since_the_last_sync_are_lost_and_those_before_it_kept() {
        let (mut file, mut n) = (FileData::default(), 0);
        file.write(0, &[1; 5000], &mut n);
        file.sync();
        file.write(4000, &[2; 2000], &mut n);
        file.truncate(4500, &mut n);
        assert_eq!(file.read(3998, 10), vec![1, 1, 2, 2, 2, 2, 2, 2, 2, 2]);
        assert_eq!(file.len, 4500);
        file.truncate(7000, &mut n);
        assert_eq!(file.read(4499, 3), vec![2, 0, 0], "extended with zeros");
        file.cut(0);
        assert_eq!(file.len, 5000);
        assert_eq!(file.read(3998, 4), vec![1, 1, 1, 1]);
        file.truncate(10, &mut n);
        file.sync();
        file.truncate(20, &mut n);
        assert_eq!(file.read(0, 30), [vec![1; 10], vec![0; 10]].concat());
    }

    #[test]
    fn a_cut_keeps_the_changes_made_before_its_instant_and_can_tear_a_write() {
        let (mut file, mut n) = (FileData::default(), 0);
        file.write(0, &[1; 100], &mut n);
        file.sync();
        // A write over two pages is two changes (2 and 3), then a third (4).
        file.write(4000, &[2; 200], &mut n);
        file.write(0, &[3; 10], &mut n);
        file.cut(2);
        assert_eq!(file.len, 4096, "the write's first page only");
        assert_eq!(file.read(3998, 4), vec![0, 0, 2, 2]);
        assert_eq!(file.read(0, 2), vec![1, 1], "the later change is gone");
    }

    #[test]
    fn names_made_since_their_directory_was_synced_are_gone() {
        let mut state = State::new();
        let kept = state.make(ROOT, OsStr::new("kept"), Node::File(FileData::default()));
        state.dir(ROOT).unwrap().stable = state.dir(ROOT).unwrap().entries.clone();
        state
            .make(ROOT, OsStr::new("new"), Node::File(FileData::default()))
            .unwrap();
        state.dir(ROOT).unwrap().entries.remove(OsStr::new("kept"));
        state.cut();
        let names: Vec<_> = state.dir(ROOT).unwrap().entries.keys().cloned().collect();
        assert_eq!(names, vec![OsString::from("kept")]);
        assert!(state.nodes.contains_key(&kept.unwrap().ino.0));
        assert_eq!(state.nodes.len(), 2, "the unnamed new file is gone");
    }
}
