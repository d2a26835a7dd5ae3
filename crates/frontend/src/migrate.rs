//! The frontend's side of a live migration, as QEMU plays it: the dirty-page log while guest
//! memory is copied, stopping the queues, and taking the device state from the source daemon
//! to the destination one.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

use vhost::vhost_user::message::{VhostTransferStateDirection, VhostTransferStatePhase};
use vhost::vhost_user::VhostUserFrontend;
use vhost::{VhostBackend, VhostUserDirtyLogRegion};

use super::error::{Error, Result};
use super::FsFrontend;

/// Page size of the vhost dirty log: one bit per 4 KiB of guest physical memory.
pub const LOG_PAGE: u64 = 4096;
/// `VHOST_F_LOG_ALL`, set in `SET_FEATURES` while a migration runs.
const VHOST_F_LOG_ALL: u64 = 1 << 26;
/// `VHOST_VRING_F_LOG`: the flag bit of `SET_VRING_ADDR` that asks for the used ring's writes
/// to be logged.
const VHOST_VRING_F_LOG: u32 = 0;

/// The dirty-page log handed to the daemon with `SET_LOG_BASE`: a memfd the daemon maps and
/// sets one bit in per guest page it writes.
#[derive(Debug)]
pub struct DirtyLog {
    file: File,
    len: u64,
}

impl DirtyLog {
    /// Guest physical page numbers marked dirty, in order.
    pub fn dirty_pages(&self) -> Result<Vec<u64>> {
        let mut bytes = vec![0u8; self.len as usize];
        self.file
            .read_exact_at(&mut bytes, 0)
            .map_err(|e| Error::io("read the dirty log", e))?;
        let mut pages = Vec::new();
        for (i, b) in bytes.iter().enumerate() {
            for bit in 0..8 {
                if b & (1 << bit) != 0 {
                    pages.push(i as u64 * 8 + bit);
                }
            }
        }
        Ok(pages)
    }

    /// Clears every bit (as QEMU does each time it has copied the dirty pages).
    pub fn clear(&self) -> Result<()> {
        self.file
            .write_all_at(&vec![0u8; self.len as usize], 0)
            .map_err(|e| Error::io("clear the dirty log", e))
    }
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| Error::io("pipe", std::io::Error::from(e)))
}

impl FsFrontend {
    fn connection(&mut self) -> Result<&mut vhost::vhost_user::Frontend> {
        self.vhost
            .as_mut()
            .ok_or_else(|| Error::Config("not connected".into()))
    }

    /// Starts dirty-page logging as QEMU 10 does when a migration starts, on the running
    /// device: `SET_LOG_BASE` with a log covering all guest memory, `SET_FEATURES` with
    /// `VHOST_F_LOG_ALL`, then `SET_VRING_ADDR` again on every queue (with the log flag).
    pub fn start_dirty_log(&mut self) -> Result<DirtyLog> {
        let pages = self.mem.gpa_end().div_ceil(LOG_PAGE);
        // One bit per page, in whole 64-bit words.
        let len = pages.div_ceil(64) * 8;
        let fd = nix::sys::memfd::memfd_create(
            c"vhost-dirty-log",
            nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
        )
        .map_err(|e| Error::io("memfd_create", std::io::Error::from(e)))?;
        let file = File::from(fd);
        file.set_len(len)
            .map_err(|e| Error::io("size the dirty log", e))?;
        let acked = self.acked_features;
        let addrs = self.vring_addrs.clone();
        let fe = self.connection()?;
        fe.set_log_base(
            0,
            Some(VhostUserDirtyLogRegion {
                mmap_size: len,
                mmap_offset: 0,
                mmap_handle: file.as_raw_fd(),
            }),
        )?;
        fe.set_features(acked | VHOST_F_LOG_ALL)?;
        for (i, a) in addrs.iter().enumerate() {
            let mut a = *a;
            a.flags |= 1 << VHOST_VRING_F_LOG;
            fe.set_vring_addr(i, &a)?;
        }
        Ok(DirtyLog { file, len })
    }

    /// Stops every queue (`GET_VRING_BASE`), as QEMU does before it saves the device; returns
    /// each queue's next available index.
    pub fn stop_queues(&mut self) -> Result<Vec<u32>> {
        let n = self.queues.len();
        let fe = self.connection()?;
        (0..n)
            .map(|i| fe.get_vring_base(i).map_err(Error::from))
            .collect()
    }

    /// The daemon's device state: `SET_DEVICE_STATE_FD` (save, device stopped) with the write
    /// end of a pipe, everything read from it, then `CHECK_DEVICE_STATE`.
    pub fn save_state(&mut self) -> Result<Vec<u8>> {
        let (rx, tx) = pipe()?;
        let fe = self.connection()?;
        let other = fe.set_device_state_fd(
            VhostTransferStateDirection::SAVE,
            VhostTransferStatePhase::STOPPED,
            tx,
        )?;
        let mut from = match other {
            Some(f) => f,
            None => File::from(rx),
        };
        let mut state = Vec::new();
        from.read_to_end(&mut state)
            .map_err(|e| Error::io("read the device state", e))?;
        fe.check_device_state()?;
        Ok(state)
    }

    /// Gives the daemon a device state: `SET_DEVICE_STATE_FD` (load) with the read end of a
    /// pipe, `state` written to it and the pipe closed, then `CHECK_DEVICE_STATE`.
    pub fn load_state(&mut self, state: &[u8]) -> Result<()> {
        let mut to = self.begin_load()?;
        // A daemon that stops reading (it refused the state) closes its end: EPIPE here, and
        // CHECK_DEVICE_STATE tells why.
        let written = to.write_all(state);
        drop(to);
        self.check_state()?;
        written.map_err(|e| Error::io("write the device state", e))
    }

    /// Starts a load (`SET_DEVICE_STATE_FD` with the read end of a pipe) and returns the end the
    /// state is written to; the daemon reads until it is closed.
    pub fn begin_load(&mut self) -> Result<File> {
        let (rx, tx) = pipe()?;
        let other = self.connection()?.set_device_state_fd(
            VhostTransferStateDirection::LOAD,
            VhostTransferStatePhase::STOPPED,
            rx,
        )?;
        Ok(other.unwrap_or_else(|| File::from(tx)))
    }

    /// `CHECK_DEVICE_STATE`: whether the last transfer succeeded (waits for it to end).
    pub fn check_state(&mut self) -> Result<()> {
        self.connection()?.check_device_state()?;
        Ok(())
    }
}
