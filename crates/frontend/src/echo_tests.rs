//! Self-tests of the frontend against a minimal in-process backend built on
//! `vhost_user_backend::VhostUserDaemon`, so the driver is proven before the real daemon exists.
//!
//! The echo backend answers every FUSE request with `-ENOSYS`, except:
//! - [`ECHO_OPCODE`]: the reply body is the request's argument bytes;
//! - [`DROP_OPCODE`]: the chain is never returned (to test timeouts);
//! - chains without writable room (FORGET) or that it cannot parse: returned with used length 0.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::Listener;
use vhost_user_backend::{VhostUserBackend, VhostUserDaemon, VringRwLock, VringT};
use virtio_queue::{DescriptorChain, QueueOwnedT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryLoadGuard, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use super::virtqueue::{Next, RawDesc, VIRTQ_DESC_F_NEXT};
use super::*;
use virtiofs_fuse::abi::{self, opcode, InHeader, OutHeader, Pod, ROOT_ID};

/// Answered with the request's arguments as body.
const ECHO_OPCODE: u32 = 0x7e57_0001;
/// Never answered.
const DROP_OPCODE: u32 = 0x7e57_0002;

const ALL_FEATURES: u64 = VIRTIO_F_VERSION_1
    | VIRTIO_RING_F_INDIRECT_DESC
    | VIRTIO_RING_F_EVENT_IDX
    | VHOST_USER_F_PROTOCOL_FEATURES;

type Mem = GuestMemoryAtomic<GuestMemoryMmap<()>>;

struct EchoBackend {
    queues: usize,
    features: u64,
    mem: Mutex<Option<Mem>>,
    event_idx: AtomicBool,
    exits: Mutex<Vec<EventNotifier>>,
    chains: AtomicU64,
}

fn other<E: std::fmt::Debug>(e: E) -> std::io::Error {
    std::io::Error::other(format!("{e:?}"))
}

impl EchoBackend {
    /// The used length to report for `chain`, or `None` to never return it.
    fn answer(
        &self,
        chain: DescriptorChain<GuestMemoryLoadGuard<GuestMemoryMmap<()>>>,
    ) -> Option<u32> {
        let mem = chain.memory();
        let Ok(mut reader) = chain.clone().reader(mem) else {
            return Some(0);
        };
        let Ok(mut writer) = chain.clone().writer(mem) else {
            return Some(0);
        };
        let mut hb = [0u8; 40];
        if reader.read_exact(&mut hb).is_err() {
            return Some(0);
        }
        let h = InHeader::from_prefix(&hb).expect("40 bytes");
        if h.opcode == DROP_OPCODE {
            return None;
        }
        if writer.available_bytes() == 0 {
            return Some(0);
        }
        let (error, body) = if h.opcode == ECHO_OPCODE {
            let n = (h.len as usize)
                .saturating_sub(40)
                .min(reader.available_bytes());
            let mut body = vec![0u8; n];
            if reader.read_exact(&mut body).is_err() {
                return Some(0);
            }
            (0, body)
        } else {
            (-libc::ENOSYS, Vec::new())
        };
        let oh = OutHeader {
            len: (16 + body.len()) as u32,
            error,
            unique: h.unique,
        };
        let _ = writer.write_all(oh.as_bytes());
        let _ = writer.write_all(&body);
        Some(writer.bytes_written() as u32)
    }

    fn process(&self, vring: &VringRwLock, mem: &Mem) -> std::io::Result<()> {
        let chains: Vec<_> = vring
            .get_mut()
            .get_queue_mut()
            .iter(mem.memory())
            .map_err(other)?
            .collect();
        for chain in chains {
            let head = chain.head_index();
            self.chains.fetch_add(1, Ordering::Relaxed);
            if let Some(len) = self.answer(chain) {
                vring.add_used(head, len).map_err(other)?;
            }
        }
        if vring.needs_notification().map_err(other)? {
            vring.signal_used_queue()?;
        }
        Ok(())
    }
}

impl VhostUserBackend for EchoBackend {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        self.queues
    }

    fn max_queue_size(&self) -> usize {
        1024
    }

    fn features(&self) -> u64 {
        self.features
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::REPLY_ACK
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn update_memory(&self, mem: Mem) -> std::io::Result<()> {
        *self.mem.lock().unwrap() = Some(mem);
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let (c, n) = new_event_consumer_and_notifier(EventFlag::NONBLOCK).ok()?;
        self.exits.lock().unwrap().push(n.try_clone().ok()?);
        Some((c, n))
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> std::io::Result<()> {
        let Some(vring) = vrings.get(usize::from(device_event)) else {
            return Ok(());
        };
        let mem = self
            .mem
            .lock()
            .unwrap()
            .clone()
            .ok_or_else(|| other("no memory table"))?;
        loop {
            vring.disable_notification().map_err(other)?;
            self.process(vring, &mem)?;
            if !vring.enable_notification().map_err(other)? {
                break;
            }
        }
        Ok(())
    }
}

/// A running echo daemon serving one connection.
struct EchoDaemon {
    path: PathBuf,
    backend: Arc<EchoBackend>,
    thread: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl EchoDaemon {
    fn start(queues: usize, features: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("echo.sock");
        let backend = Arc::new(EchoBackend {
            queues,
            features,
            mem: Mutex::new(None),
            event_idx: AtomicBool::new(false),
            exits: Mutex::new(Vec::new()),
            chains: AtomicU64::new(0),
        });
        let mut listener = Listener::new(&path, true).unwrap();
        let b = backend.clone();
        let thread = std::thread::spawn(move || {
            let mut daemon = VhostUserDaemon::new(
                "echo".into(),
                b.clone(),
                GuestMemoryAtomic::new(GuestMemoryMmap::new()),
            )
            .unwrap();
            daemon.start(&mut listener).unwrap();
            let _ = daemon.wait();
            for n in b.exits.lock().unwrap().drain(..) {
                let _ = n.notify();
            }
        });
        EchoDaemon {
            path,
            backend,
            thread: Some(thread),
            _dir: dir,
        }
    }

    fn path(&self) -> &Path {
        &self.path
    }

    /// Waits (bounded) for the daemon's connection thread to end.
    fn join(mut self) {
        let t = self.thread.take().unwrap();
        for _ in 0..500 {
            if t.is_finished() {
                t.join().unwrap();
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("echo daemon did not notice the disconnect");
    }
}

fn config() -> FrontendConfig {
    FrontendConfig {
        mem_size: 16 << 20,
        client_arena_size: 2 << 20,
        timeout: Duration::from_secs(5),
        ..Default::default()
    }
}

#[test]
fn round_trip_gets_enosys_with_matching_unique() {
    let d = EchoDaemon::start(2, ALL_FEATURES);
    let mut fs = FsFrontend::connect_with(d.path(), 1, &config()).unwrap();
    assert!(fs.event_idx() && fs.indirect());
    assert!(fs
        .protocol_features()
        .contains(VhostUserProtocolFeatures::MQ));
    let mut c = fs.client(0).unwrap();

    let t = c
        .submit(opcode::LOOKUP, ROOT_ID, &[b"name\0"], 128)
        .unwrap();
    let r = c.wait(t).unwrap();
    assert_eq!(r.unique, t.unique);
    assert_eq!(r.error, -libc::ENOSYS);
    assert!(r.body.is_empty());

    let r2 = c.request(opcode::GETATTR, ROOT_ID, &[], 104).unwrap();
    assert_eq!(r2.unique, t.unique + UNIQUE_STEP_FOR_TESTS);
    assert_eq!(r2.errno(), Some(libc::ENOSYS));

    let r3 = c
        .request_with_ctx(opcode::STATFS, ROOT_ID, &[], 80, 1234, 5678, 9)
        .unwrap();
    assert_eq!(r3.error, -libc::ENOSYS);

    // Typed helpers turn the reply into the errno.
    assert_eq!(c.lookup(ROOT_ID, "x").unwrap_err(), libc::ENOSYS);
    assert_eq!(c.init().unwrap_err(), libc::ENOSYS);
    assert_eq!(c.init_compat().unwrap_err(), libc::ENOSYS);
    assert_eq!(c.readdir(ROOT_ID, 0, 0, 4096).unwrap_err(), libc::ENOSYS);
    assert_eq!(c.write(2, 0, 0, b"data").unwrap_err(), libc::ENOSYS);
    assert_eq!(c.syncfs().unwrap_err(), libc::ENOSYS);
    assert_eq!(c.in_flight(), 0);

    drop(fs);
    d.join();
}

const UNIQUE_STEP_FOR_TESTS: u64 = super::fuse_client::UNIQUE_STEP;

#[test]
fn forget_chains_come_back_with_used_len_zero() {
    let d = EchoDaemon::start(2, ALL_FEATURES);
    let mut fs = FsFrontend::connect_with(d.path(), 1, &config()).unwrap();
    let mut hp = fs.hiprio_client().unwrap();
    hp.forget(5, 1);
    hp.batch_forget(&[(5, 1), (6, 2), (7, 3)]);
    let t = hp
        .submit(
            opcode::FORGET,
            9,
            &[abi::ForgetIn { nlookup: 1 }.as_bytes()],
            0,
        )
        .unwrap();
    assert_eq!(t.kind, TicketKind::NoReply);
    let c = hp.wait_completion(t).unwrap();
    assert_eq!(c.used_len, 0);
    assert!(c.data.is_empty());
    assert_eq!(d.backend.chains.load(Ordering::Relaxed), 3);
    drop(fs);
    d.join();
}

#[test]
fn echo_survives_every_sg_layout_with_and_without_indirect() {
    let d = EchoDaemon::start(2, ALL_FEATURES);
    let mut fs = FsFrontend::connect_with(d.path(), 1, &config()).unwrap();
    let mut c = fs.client(0).unwrap();
    let payload: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 3) as u8).collect();
    for layout in [
        SgLayout::PerArg,
        SgLayout::Contiguous,
        SgLayout::Chunked(1),
        SgLayout::Chunked(7),
        SgLayout::Chunked(4096),
    ] {
        for indirect in [false, true] {
            c.set_sg_layout(layout);
            c.set_indirect(indirect).unwrap();
            // Small chunks need many descriptors: keep the chain within the queue size.
            let len = match layout {
                SgLayout::Chunked(n) => payload.len().min(n * 120 - 60),
                _ => payload.len(),
            };
            let (a, b) = payload[..len].split_at(len / 3);
            let r = c.request(ECHO_OPCODE, ROOT_ID, &[a, b], len).unwrap();
            assert_eq!(r.error, 0, "{layout:?} indirect={indirect}");
            assert_eq!(r.body, &payload[..len], "{layout:?} indirect={indirect}");
        }
    }
    // A reply that does not fit: the device stops at the writable capacity, and the frontend
    // reports the header/length mismatch instead of returning garbage.
    c.set_sg_layout(SgLayout::PerArg);
    c.set_indirect(false).unwrap();
    let err = c
        .request(ECHO_OPCODE, ROOT_ID, &[&payload[..100]], 10)
        .unwrap_err();
    assert!(matches!(err, Error::Protocol(_)), "{err}");
    drop(fs);
    d.join();
}

#[test]
fn pipelined_requests_beyond_the_queue_size() {
    let d = EchoDaemon::start(2, ALL_FEATURES);
    let cfg = FrontendConfig {
        queue_size: 64,
        ..config()
    };
    let mut fs = FsFrontend::connect_with(d.path(), 1, &cfg).unwrap();
    let mut c = fs.client(0).unwrap();
    c.set_poison_replies(false);
    let total = 2000u32;
    let mut sent = 0u32;
    let mut expected = std::collections::HashMap::new();
    let mut received = 0u32;
    while received < total {
        // Fill the queue (2 descriptors per request with PerArg and no reply body split).
        let mut batch = 0;
        while sent < total && c.queue().num_free() >= 4 && batch < 48 {
            let body = sent.to_le_bytes();
            let t = c.enqueue(ECHO_OPCODE, ROOT_ID, &[&body], 4).unwrap();
            expected.insert(t, sent);
            sent += 1;
            batch += 1;
        }
        c.publish().unwrap();
        // Drain at least one, then whatever else is ready.
        let mut done = vec![c.complete().unwrap()];
        while let Some(x) = c.try_complete().unwrap() {
            done.push(x);
        }
        for comp in done {
            let n = expected.remove(&comp.ticket).expect("known ticket");
            let r = comp.into_reply().unwrap();
            assert_eq!(r.body, n.to_le_bytes());
            received += 1;
        }
    }
    assert!(expected.is_empty());
    let s = c.queue().stats();
    assert_eq!(s.completed, u64::from(total));
    // With EVENT_IDX the backend suppresses kicks while it is busy; at minimum every batch
    // was published behind at most one kick.
    assert!(s.kicks <= s.added);
    drop(fs);
    d.join();
}

#[test]
fn plain_rings_without_event_idx_or_indirect() {
    let d = EchoDaemon::start(2, VIRTIO_F_VERSION_1 | VHOST_USER_F_PROTOCOL_FEATURES);
    let mut fs = FsFrontend::connect_with(d.path(), 1, &config()).unwrap();
    assert!(!fs.event_idx() && !fs.indirect());
    let mut c = fs.client(0).unwrap();
    assert!(matches!(c.set_indirect(true), Err(Error::NotNegotiated(_))));
    for i in 0..300u32 {
        let r = c
            .request(ECHO_OPCODE, ROOT_ID, &[&i.to_le_bytes()], 4)
            .unwrap();
        assert_eq!(r.body, i.to_le_bytes());
    }
    drop(fs);
    d.join();
}

#[test]
fn features_can_be_declined_by_the_frontend() {
    let d = EchoDaemon::start(2, ALL_FEATURES);
    let cfg = FrontendConfig {
        event_idx: false,
        indirect: false,
        ..config()
    };
    let mut fs = FsFrontend::connect_with(d.path(), 1, &cfg).unwrap();
    assert_eq!(
        fs.acked_features(),
        VIRTIO_F_VERSION_1 | VHOST_USER_F_PROTOCOL_FEATURES
    );
    let mut c = fs.client(0).unwrap();
    assert_eq!(
        c.request(opcode::STATFS, ROOT_ID, &[], 80).unwrap().error,
        -libc::ENOSYS
    );
    assert!(!d.backend.event_idx.load(Ordering::Relaxed));
    drop(fs);
    d.join();
}

#[test]
fn ring_indices_start_near_the_wrap() {
    let d = EchoDaemon::start(2, ALL_FEATURES);
    let cfg = FrontendConfig {
        initial_ring_index: 65500,
        queue_size: 16,
        ..config()
    };
    let mut fs = FsFrontend::connect_with(d.path(), 1, &cfg).unwrap();
    let mut c = fs.client(0).unwrap();
    for i in 0..200u32 {
        let r = c
            .request(ECHO_OPCODE, ROOT_ID, &[&i.to_le_bytes()], 4)
            .unwrap();
        assert_eq!(r.body, i.to_le_bytes());
    }
    assert_eq!(c.queue().avail_index(), 65500u16.wrapping_add(200));
    drop(fs);
    d.join();
}

#[test]
fn unanswered_requests_time_out() {
    let d = EchoDaemon::start(2, ALL_FEATURES);
    let mut fs = FsFrontend::connect_with(d.path(), 1, &config()).unwrap();
    let mut c = fs.client(0).unwrap();
    c.set_timeout(Duration::from_millis(100));
    let err = c.request(DROP_OPCODE, ROOT_ID, &[], 16).unwrap_err();
    assert!(err.is_timeout(), "{err}");
    drop(fs);
    d.join();
}

#[test]
#[should_panic(expected = "timed out")]
fn typed_helpers_panic_instead_of_hanging() {
    let d = EchoDaemon::start(2, ALL_FEATURES);
    let mut fs = FsFrontend::connect_with(d.path(), 1, &config()).unwrap();
    let mut c = fs.client(0).unwrap();
    c.set_timeout(Duration::from_millis(100));
    fs.disconnect();
    d.join();
    let _ = c.getattr(ROOT_ID, None);
}

#[test]
fn raw_chains_reach_the_device() {
    let d = EchoDaemon::start(2, ALL_FEATURES);
    let mut fs = FsFrontend::connect_with(d.path(), 1, &config()).unwrap();
    let mut c = fs.client(0).unwrap();
    let mem = c.memory().clone();
    let buf = c.alloc_buffer(4096).unwrap();
    let hdr = InHeader {
        len: 40,
        opcode: opcode::GETATTR,
        unique: 77,
        nodeid: ROOT_ID,
        ..Default::default()
    };
    mem.write_obj(buf, &hdr).unwrap();

    // Only readable descriptors: returned with used length 0.
    let t = c.submit_raw_chain(&[RawDesc::readable(buf, 40)]).unwrap();
    assert_eq!(c.wait_completion(t).unwrap().used_len, 0);

    // Header split over a readable loop 0 -> 1 -> 0: the device must not spin forever.
    let mut descs = RawDesc::chain(&[Buffer::readable(buf, 20), Buffer::readable(buf + 20, 20)]);
    descs[1].flags |= VIRTQ_DESC_F_NEXT;
    descs[1].next = Next::Slot(0);
    let t = c.submit_raw_chain(&descs).unwrap();
    c.wait_completion(t).unwrap();

    // A correct chain built by hand, header in the raw writable buffer.
    let t = c
        .submit_raw_chain(&RawDesc::chain(&[
            Buffer::readable(buf, 40),
            Buffer::writable(buf + 1024, 64),
        ]))
        .unwrap();
    let comp = c.wait_completion(t).unwrap();
    assert_eq!(comp.used_len, 16);
    let oh: OutHeader = mem.read_obj(buf + 1024).unwrap();
    assert_eq!((oh.len, oh.error, oh.unique), (16, -libc::ENOSYS, 77));

    // Through an indirect table.
    let t = c
        .submit_raw_indirect(
            super::virtqueue::VIRTQ_DESC_F_INDIRECT,
            &RawDesc::chain(&[Buffer::readable(buf, 40), Buffer::writable(buf + 2048, 16)]),
            None,
        )
        .unwrap();
    assert_eq!(c.wait_completion(t).unwrap().used_len, 16);

    // Raw bytes through the normal buffer path, parsed without a unique check.
    let bytes =
        super::fuse_client::build_request(5, opcode::ACCESS, 1, Ctx::current(), &[&[0u8; 8]]);
    let comp = c.request_raw(&[&bytes], 16).unwrap();
    let r = comp.into_reply().unwrap();
    assert_eq!((r.unique, r.error), (5, -libc::ENOSYS));

    // The queue is still healthy.
    assert_eq!(c.statfs(ROOT_ID).unwrap_err(), libc::ENOSYS);
    drop(fs);
    d.join();
}

#[test]
fn queues_work_from_separate_threads() {
    let d = EchoDaemon::start(3, ALL_FEATURES);
    let mut fs = FsFrontend::connect_with(d.path(), 2, &config()).unwrap();
    assert_eq!(fs.num_queues(), 3);
    let clients = [fs.client(0).unwrap(), fs.client(1).unwrap()];
    assert!(matches!(fs.client(0), Err(Error::NoSuchQueue(1))));
    assert!(matches!(fs.client(2), Err(Error::NoSuchQueue(3))));
    let threads: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(q, mut c)| {
            std::thread::spawn(move || {
                let mut uniques = Vec::new();
                for i in 0..500u32 {
                    let body = [q as u8, i as u8];
                    let t = c.submit(ECHO_OPCODE, ROOT_ID, &[&body], 2).unwrap();
                    let r = c.wait(t).unwrap();
                    assert_eq!(r.body, body);
                    uniques.push(t.unique);
                }
                uniques
            })
        })
        .collect();
    let mut all: Vec<u64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 1000, "request ids are unique across queues");
    drop(fs);
    d.join();
}

#[test]
fn too_many_queues_are_refused() {
    let d = EchoDaemon::start(2, ALL_FEATURES);
    let err = FsFrontend::connect_with(d.path(), 4, &config()).unwrap_err();
    assert!(matches!(err, Error::Handshake(_)), "{err}");
    d.join();
}

#[test]
fn connecting_waits_for_the_socket_to_appear() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("late.sock");
    let cfg = FrontendConfig {
        connect_timeout: Duration::from_millis(100),
        ..config()
    };
    let err = FsFrontend::connect_with(&path, 1, &cfg).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
}
