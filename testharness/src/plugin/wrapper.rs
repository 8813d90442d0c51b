//! [`Net`], the loaded plugin, and the handles it gives out: comms and the calls that lend
//! FIFO slots to the plugin (the safety model is in the [module docs](super)).

use std::cell::{Cell, Ref, RefCell};
use std::ffi::{c_int, c_void};
use std::fmt;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::ptr;
use std::time::Instant;

use libloading::os::unix::{Library, Symbol};
use nccl_net_verbsnet::ffi::abi::{NCCL_NET_OPTIONAL_RECV_COMPLETION, NCCL_PTR_HOST};

use super::fifo::{Fifo, Memory, Request};
use super::load::{loaded_path, name_matches, open_first, Opened};
use super::logger;
use super::table::{
    symbol, Close, Exported, InitArgs, Properties, Table, VDeviceSlot, MAX_GROUP, VERSIONS,
};
use super::{Error, Result, HANDLE_SIZE};
use crate::calltimes::{CallKind, CallTimes};

/// Entries of the sizes array `test` gets (NCCL's `NCCL_PROXY_MAX_SUBS`, `src/include/proxy.h`).
const NCCL_PROXY_MAX_SUBS: usize = 64;

/// A context made by a v11+ `init(ctx, commId, config)`: one NCCL communicator's view of the
/// plugin. Pass it to [`Net::listen_in`]/[`Net::connect_in`]; end it with
/// [`Net::finalize_context`].
pub struct Context<'n> {
    ptr: *mut c_void,
    comm_id: u64,
    _net: PhantomData<&'n Net>,
}

impl Context<'_> {
    /// The communicator id passed to `init`.
    pub fn comm_id(&self) -> u64 {
        self.comm_id
    }
}

/// The loaded plugin.
pub struct Net {
    /// The table where the library exports it (read at load for `name`, and for `init`).
    exported: Exported,
    /// The table as copied after the last successful `init`; `None` before it. Borrowed by
    /// each call, not copied (about 190 bytes), as NCCL calls through its copy.
    table: RefCell<Option<Table>>,
    version: u32,
    /// The context of [`Net::init`] from it until [`Net::finalize`] (v11+; `None` before,
    /// after, and for older versions). The pointer may be NULL: NCCL's own socket transport
    /// leaves it unset (`src/transport/net_socket.cc`: `ncclNetSocketInit`), and NCCL passes it
    /// back to `listen`, `connect` and `finalize` as it is (`src/plugin/net.cc`).
    ctx: Cell<Option<*mut c_void>>,
    /// Whether `isend`, `irecv` and `test` are timed ([`Net::set_call_timing`]).
    timing: Cell<bool>,
    /// What the timed calls took since the last [`Net::take_call_times`].
    times: Cell<CallTimes>,
    name: String,
    path: PathBuf,
    // Keeps the library mapped; declared last so it is dropped after everything else.
    _lib: Library,
}

impl Net {
    /// Loads the plugin as NCCL would for `NCCL_NET_PLUGIN=value` (see
    /// [`search_order`](super::search_order)), takes the newest table it exports (probing v12
    /// … v6 like NCCL) and reads its `name`, which must match `wanted_name` (`NCCL_NET`) when
    /// one is given: with `NCCL_NET` unset NCCL takes whichever plugin loaded
    /// (`src/plugin/net.cc`: `ncclNetInit` compares names only when `netName` is set). Does not
    /// call `init`: until [`Net::init`], only [`Net::name`], [`Net::version`] and [`Net::path`]
    /// answer.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::MissingSymbol`], [`Error::NameMismatch`].
    pub fn load(value: &str, wanted_name: Option<&str>, exe_dir: Option<&Path>) -> Result<Net> {
        Net::load_version(value, wanted_name, exe_dir, None)
    }

    /// What NCCL does with `NCCL_NET_PLUGIN` and `NCCL_NET` before it uses a plugin
    /// (`src/plugin/net.cc`: `initPluginLibsOnceFunc`, `ncclNetInit`): the value is a
    /// comma-separated list (`none` disables external plugins), tried in order; the first
    /// library that loads, whose name matches `NCCL_NET` (if set), whose `init` succeeds and
    /// which reports at least one device is the one used. Returns it initialised
    /// ([`Net::init`]).
    ///
    /// # Errors
    /// A single entry's own error; [`Error::NoneUsable`] listing every entry of a longer list;
    /// [`Error::Usage`] for `none` or an empty list.
    pub fn open(
        value: &str,
        wanted_name: Option<&str>,
        exe_dir: Option<&Path>,
        version: Option<u32>,
    ) -> Result<Net> {
        if value.trim().eq_ignore_ascii_case("none") {
            return Err(Error::Usage(
                "NCCL_NET_PLUGIN=none: NCCL uses no external plugin then, so verbsnet-perf has \
                 nothing to drive"
                    .into(),
            ));
        }
        let entries: Vec<&str> = value.split(',').filter(|e| !e.is_empty()).collect();
        let mut tried = Vec::new();
        for entry in &entries {
            let attempt = Net::load_version(entry, wanted_name, exe_dir, version).and_then(|net| {
                net.init()?;
                match net.devices()? {
                    n if n > 0 => Ok(net),
                    // Dropping `net` finalizes its context, as NCCL does here.
                    n => Err(Error::NoDevice {
                        path: net.path().display().to_string(),
                        count: n,
                    }),
                }
            });
            match attempt {
                Ok(net) => return Ok(net),
                Err(e) if entries.len() == 1 => return Err(e),
                Err(e) => tried.push((entry.to_string(), e.to_string())),
            }
        }
        if tried.is_empty() {
            return Err(Error::Usage(format!(
                "NCCL_NET_PLUGIN={value:?} names no library"
            )));
        }
        Err(Error::NoneUsable {
            value: value.to_string(),
            tried,
        })
    }

    /// [`Net::load`] with a chosen ABI version (`Some(6..=12)`), or the newest (`None`).
    ///
    /// # Errors
    /// As [`Net::load`]; [`Error::Usage`] for a version outside 6..=12.
    pub fn load_version(
        value: &str,
        wanted_name: Option<&str>,
        exe_dir: Option<&Path>,
        version: Option<u32>,
    ) -> Result<Net> {
        if let Some(v) = version {
            if !VERSIONS.contains(&v) {
                return Err(Error::Usage(format!(
                    "--net-version {v}: verbsnet-perf drives ncclNet versions 6 to 12"
                )));
            }
        }
        let Opened { candidate, lib, .. } = open_first(value, exe_dir)?;
        let order: Vec<u32> = version.map_or_else(|| VERSIONS.to_vec(), |v| vec![v]);
        let mut found = None;
        let mut last_err = String::new();
        for v in order {
            // SAFETY: the symbol is a `static ncclNet_vN_t` by the ABI; we only take its
            // address.
            let sym: std::result::Result<Symbol<*const c_void>, _> =
                unsafe { lib.get(symbol(v).as_bytes()) };
            match sym {
                Ok(s) => {
                    found = Some((v, *s));
                    break;
                }
                Err(e) => last_err = e.to_string(),
            }
        }
        let Some((v, addr)) = found else {
            return Err(Error::MissingSymbol {
                path: candidate,
                wanted: version.map_or_else(
                    || "any of ncclNetPlugin_v12 … ncclNetPlugin_v6".into(),
                    symbol,
                ),
                detail: last_err,
            });
        };
        // SAFETY: the symbol `ncclNetPlugin_v<v>` is a `ncclNet_v<v>_t` by the ABI, `v` is one
        // of VERSIONS, and the returned `Net` keeps `lib` loaded while it uses `exported`.
        let exported = unsafe { Exported::new(addr, v) };
        let path = loaded_path(addr).unwrap_or_else(|| PathBuf::from(&candidate));
        // NCCL matches NCCL_NET against the name it read when it loaded the table, before
        // init (src/plugin/net.cc: ncclNetInit).
        let name = exported.name();
        if let Some(wanted) = wanted_name.filter(|w| !name_matches(&name, w)) {
            return Err(Error::NameMismatch {
                path: path.display().to_string(),
                found: name,
                wanted: wanted.to_string(),
            });
        }
        Ok(Net {
            exported,
            table: RefCell::new(None),
            version: v,
            ctx: Cell::new(None),
            timing: Cell::new(false),
            times: Cell::new(CallTimes::default()),
            name,
            path,
            _lib: lib,
        })
    }

    /// Times every `isend`, `irecv` and `test` from now on (`on`), or stops: the wall time
    /// of each call, by what it did ([`CallKind`]), for [`Net::take_call_times`]. Off by
    /// default: the two clock reads add about 50 ns per call.
    pub fn set_call_timing(&self, on: bool) {
        self.timing.set(on);
    }

    /// What the timed calls took since the last take (or since timing started), and starts
    /// over.
    pub fn take_call_times(&self) -> CallTimes {
        self.times.take()
    }

    /// The start of a call to time: `Some(now)` when timing is on.
    fn call_start(&self) -> Option<Instant> {
        self.timing.get().then(Instant::now)
    }

    /// Counts a call started at `start` (when timed) as `kind`.
    fn call_end(&self, start: Option<Instant>, kind: CallKind) {
        if let Some(t) = start {
            let mut times = self.times.get();
            times.add(kind, t.elapsed());
            self.times.set(times);
        }
    }

    /// The table's `name`, as read at load.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The ABI version in use (6 … 12).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The symbol of the table in use, e.g. `ncclNetPlugin_v12`.
    pub fn symbol(&self) -> String {
        symbol(self.version)
    }

    /// The file the loader mapped (as the loader names it; may be a symlink).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The table copied after `init`.
    fn table(&self) -> Result<Ref<'_, Table>> {
        Ref::filter_map(self.table.borrow(), Option::as_ref)
            .map_err(|_| Error::Usage("a table call before init".into()))
    }

    /// Calls the exported table's `init` as it is now, then copies the table (what NCCL's
    /// version shims do, see [`super::table`]); returns the context (v11+, else NULL).
    fn init_raw(&self, comm_id: u64, traffic_class: i32) -> Result<*mut c_void> {
        let args = InitArgs {
            logger: logger::nccl_logger(),
            profiler: logger::profiler_callback(),
            comm_id,
            traffic_class,
        };
        // SAFETY: the library is loaded (self keeps it); the logger and the profiler callback
        // are functions of this program, alive as long as it runs.
        let ctx = unsafe { self.exported.snapshot().init(&args) }?;
        *self.table.borrow_mut() = Some(self.exported.snapshot());
        Ok(ctx)
    }

    /// `init` with NCCL's arguments (see the module docs), then the table is copied. For v11+
    /// this makes the default context (commId = the process id), used by
    /// [`Net::listen`]/[`Net::connect`] and ended by [`Net::finalize`].
    ///
    /// # Errors
    /// NULL slot or a non-success return.
    pub fn init(&self) -> Result<()> {
        let ctx = self.init_raw(u64::from(std::process::id()), -1)?;
        self.ctx.set((self.version >= 11).then_some(ctx));
        Ok(())
    }

    /// v11+: `init(ctx, commId, {trafficClass})`, one more communicator context
    /// (`traffic_class` -1 = unset); the table is copied again after it.
    ///
    /// # Errors
    /// A version without contexts ([`Error::Usage`]), NULL slot or a non-success return.
    pub fn init_context(&self, comm_id: u64, traffic_class: i32) -> Result<Context<'_>> {
        if self.version < 11 {
            return Err(Error::Usage(format!(
                "ncclNet v{} has no per-communicator contexts (v11+)",
                self.version
            )));
        }
        let ptr = self.init_raw(comm_id, traffic_class)?;
        Ok(Context {
            ptr,
            comm_id,
            _net: PhantomData,
        })
    }

    /// v11+: `finalize(ctx)`.
    ///
    /// # Errors
    /// NULL slot or a non-success return.
    pub fn finalize_context(&self, ctx: Context<'_>) -> Result<()> {
        // SAFETY: ctx came from this plugin's init and is finalized once (consumed here).
        unsafe { self.table()?.finalize(ctx.ptr) }
    }

    /// Ends the context of [`Net::init`] (v11+: `finalize`, also of a NULL context, as NCCL
    /// calls it; older versions have no finalize, and a second call does nothing).
    ///
    /// # Errors
    /// NULL slot or a non-success return.
    pub fn finalize(&self) -> Result<()> {
        let Some(p) = self.ctx.take() else {
            return Ok(());
        };
        self.finalize_context(Context {
            ptr: p,
            comm_id: 0,
            _net: PhantomData,
        })
    }

    /// `devices`: the number of devices.
    ///
    /// # Errors
    /// NULL slot or a non-success return.
    pub fn devices(&self) -> Result<i32> {
        self.table()?.devices()
    }

    /// `getProperties(dev)` of the version in use.
    ///
    /// # Errors
    /// NULL slot, a non-success return, or a `maxP2pBytes` NCCL rejects.
    pub fn properties(&self, dev: i32) -> Result<Properties> {
        self.table()?.properties(dev)
    }

    /// What the table offers for NIC fusion: no `makeVDevice` member (v6-v8), a NULL one, or
    /// a set one with NCCL's limit of physical devices per virtual device.
    ///
    /// # Errors
    /// A call before `init`.
    pub fn vdevice_slot(&self) -> Result<VDeviceSlot> {
        Ok(self.table()?.vdevice_slot())
    }

    /// `makeVDevice(&d, {ndevs, devs})` as NCCL's topology code calls it (`src/graph/topo.cc`:
    /// `ncclTopoMakeVnic`): the props in the layout of the version in use, `d` preset to 0.
    /// Returns the index the plugin wrote to `d`; what the plugin then reports (`devices`,
    /// `getProperties(d).vProps`) is for the caller to check.
    ///
    /// # Errors
    /// A version without the slot or more devices than its props hold ([`Error::Usage`]), a
    /// NULL slot, or a non-success return ([`Error::Call`]).
    pub fn make_vdevice(&self, devs: &[i32]) -> Result<i32> {
        self.table()?.make_vdevice(devs)
    }

    /// `listen(dev)` (in the default context for v11+): returns the handle to ship to the
    /// connecting side, and the listen comm.
    ///
    /// # Errors
    /// NULL slot, a non-success return, or success with a NULL comm.
    pub fn listen(&self, dev: i32) -> Result<(Handle, ListenComm<'_>)> {
        self.listen_raw(self.ctx.get().unwrap_or(ptr::null_mut()), dev)
    }

    /// `listen(ctx, dev)` in context `ctx` (v11+).
    ///
    /// # Errors
    /// As [`Net::listen`].
    pub fn listen_in(&self, ctx: &Context<'_>, dev: i32) -> Result<(Handle, ListenComm<'_>)> {
        self.listen_raw(ctx.ptr, dev)
    }

    fn listen_raw(&self, ctx: *mut c_void, dev: i32) -> Result<(Handle, ListenComm<'_>)> {
        // What the receive comms accepted here may group (NCCL reads it per device too).
        let max_recvs = self.properties(dev)?.max_recvs.max(1) as usize;
        let mut handle = Handle::zeroed();
        let h = handle.0.as_mut_ptr().cast();
        // SAFETY: the handle buffer is HANDLE_SIZE bytes as the ABI requires; ctx came from
        // init (v11+).
        let comm = unsafe { self.table()?.listen(ctx, dev, h) }?;
        if comm.is_null() {
            return Err(Error::Contract(
                "listen succeeded with a NULL listenComm".into(),
            ));
        }
        Ok((
            handle,
            ListenComm {
                ptr: comm,
                net: self,
                max_recvs,
            },
        ))
    }

    /// One non-blocking `connect` attempt (in the default context for v11+); `None` means
    /// "not yet, call again with the same handle" (the plugin may keep connection progress
    /// inside the handle). v10 passes a connect config with trafficClass -1 (unset).
    ///
    /// # Errors
    /// NULL slot or a non-success return.
    pub fn connect(&self, dev: i32, handle: &mut Handle) -> Result<Option<SendComm<'_>>> {
        self.connect_raw(self.ctx.get().unwrap_or(ptr::null_mut()), dev, handle)
    }

    /// [`Net::connect`] in context `ctx` (v11+).
    ///
    /// # Errors
    /// As [`Net::connect`].
    pub fn connect_in(
        &self,
        ctx: &Context<'_>,
        dev: i32,
        handle: &mut Handle,
    ) -> Result<Option<SendComm<'_>>> {
        self.connect_raw(ctx.ptr, dev, handle)
    }

    fn connect_raw(
        &self,
        ctx: *mut c_void,
        dev: i32,
        handle: &mut Handle,
    ) -> Result<Option<SendComm<'_>>> {
        let h = handle.0.as_mut_ptr().cast();
        // SAFETY: the handle is HANDLE_SIZE bytes, the caller keeps the same one for every
        // retry; ctx came from init (v11+).
        let comm = unsafe { self.table()?.connect(ctx, dev, h) }?;
        // `then`, not `then_some`: a comm wrapper must never exist for NULL (its drop closes it).
        Ok((!comm.is_null()).then(|| SendComm {
            ptr: comm,
            net: self,
        }))
    }

    /// One non-blocking `accept` attempt; `None` means "not yet".
    ///
    /// # Errors
    /// NULL slot or a non-success return.
    pub fn accept<'n>(&'n self, listen: &mut ListenComm<'n>) -> Result<Option<RecvComm<'n>>> {
        self.owns(listen.net)?;
        // SAFETY: `listen.ptr` is a live listen comm of this plugin.
        let comm = unsafe { self.table()?.accept(listen.ptr) }?;
        Ok((!comm.is_null()).then(|| RecvComm {
            ptr: comm,
            net: self,
            max_recvs: listen.max_recvs,
        }))
    }

    fn raw_close(&self, which: Close, ptr: *mut c_void) -> Result<()> {
        // SAFETY: `ptr` is a live comm of the matching kind, consumed by the caller.
        unsafe { self.table()?.close(which, ptr) }
    }

    /// `closeListen`.
    ///
    /// # Errors
    /// NULL slot or a non-success return.
    pub fn close_listen(&self, listen: ListenComm<'_>) -> Result<()> {
        let ptr = listen.ptr;
        std::mem::forget(listen);
        self.raw_close(Close::Listen, ptr)
    }

    /// `closeSend`.
    ///
    /// # Errors
    /// NULL slot or a non-success return.
    pub fn close_send(&self, comm: SendComm<'_>) -> Result<()> {
        let ptr = comm.ptr;
        std::mem::forget(comm);
        self.raw_close(Close::Send, ptr)
    }

    /// `closeRecv`.
    ///
    /// # Errors
    /// NULL slot or a non-success return.
    pub fn close_recv(&self, comm: RecvComm<'_>) -> Result<()> {
        let ptr = comm.ptr;
        std::mem::forget(comm);
        self.raw_close(Close::Recv, ptr)
    }

    /// Allocates `slots × slot_size` bytes of host memory and registers it once with
    /// `regMr(comm, .., NCCL_PTR_HOST)`, like one NCCL connection FIFO.
    ///
    /// # Errors
    /// NULL slot or a non-success return.
    pub fn reg_mr<'n>(
        &'n self,
        comm: &impl Comm<'n>,
        slots: usize,
        slot_size: usize,
    ) -> Result<Fifo<'n>> {
        self.owns(comm.net())?;
        if slots == 0 || slot_size == 0 || slot_size > i32::MAX as usize {
            return Err(Error::Usage(format!(
                "FIFO of {slots} slots × {slot_size} bytes"
            )));
        }
        let table = self.table()?;
        let mem = Memory::new(slots * slot_size)?;
        // SAFETY: `mem` is a live allocation of `mem.len` bytes that stays put until deregMr (or
        // leaks); `comm` is a live comm of this plugin.
        let mhandle =
            unsafe { table.reg_mr(comm.raw(), mem.ptr.cast(), mem.len, NCCL_PTR_HOST as c_int) }?;
        Ok(Fifo::new(mem, slots, slot_size, mhandle, comm.raw()))
    }

    /// `deregMr`, then frees the memory. Refuses (and keeps the memory) while slots are busy.
    ///
    /// # Errors
    /// NULL slot, a non-success return, busy slots or a FIFO of another comm.
    pub fn dereg_mr<'n>(&'n self, comm: &impl Comm<'n>, mut fifo: Fifo<'n>) -> Result<()> {
        let table = self.table()?;
        if fifo.comm != comm.raw() {
            return Err(Error::Usage("deregMr with a FIFO of another comm".into()));
        }
        if fifo.busy.iter().any(|b| *b) {
            return Err(Error::Usage("deregMr with requests in flight".into()));
        }
        let mhandle = std::mem::replace(&mut fifo.mhandle, ptr::null_mut());
        // SAFETY: `mhandle` came from regMr on this comm and is deregistered once.
        unsafe { table.dereg_mr(comm.raw(), mhandle) }
        // `fifo` drops here: no busy slots, so its memory is freed.
    }

    /// `isend` of the first `len` bytes of `slot`, with `tag`. `None`: the plugin cannot start
    /// it now (retry later); the slot stays free. Sizes go as `int` (v6-v8) or `size_t` (v9+);
    /// v10+ get a profiler handle (the slot's, as NCCL passes one per step).
    ///
    /// # Errors
    /// NULL slot, a non-success return, or a busy/out-of-range slot.
    pub fn isend<'n>(
        &'n self,
        comm: &mut SendComm<'n>,
        fifo: &mut Fifo<'n>,
        slot: usize,
        len: usize,
        tag: i32,
    ) -> Result<Option<Request<'n>>> {
        let table = self.table()?;
        let data = fifo.lend(comm.ptr, slot, len)?;
        let ph = fifo.phandle(slot);
        let start = self.call_start();
        // SAFETY: `data..data+len` lies inside the registered FIFO, which stays allocated and
        // untouched by Rust while the slot is busy; `comm` is a live send comm; the profiler
        // handle lives in the FIFO.
        let req = unsafe { table.isend(comm.ptr, data, len, tag, fifo.mhandle, ph) }?;
        self.call_end(start, CallKind::isend(!req.is_null()));
        Ok(fifo.track(slot, req))
    }

    /// `irecv` of one buffer (n = 1): `slot` with capacity `capacity`, expecting `tag`.
    /// `None`: not now, retry later. For v9+ the request is preset to
    /// `NCCL_NET_OPTIONAL_RECV_COMPLETION` (0x1), as NCCL does for LL/LL128 receives, and the
    /// plugin must overwrite it.
    ///
    /// # Errors
    /// NULL slot, a non-success return, or a busy/out-of-range slot.
    pub fn irecv<'n>(
        &'n self,
        comm: &mut RecvComm<'n>,
        fifo: &mut Fifo<'n>,
        slot: usize,
        capacity: usize,
        tag: i32,
    ) -> Result<Option<Request<'n>>> {
        self.irecv_group(comm, fifo, &[slot], &[capacity], &[tag])
    }

    /// Grouped `irecv` (n = `slots.len()`, 1..=8, at most the device's `maxRecvs`, see
    /// [`RecvComm::max_recvs`]): buffer `i`
    /// is FIFO slot `slots[i]` with capacity `caps[i]`, expecting tag `tags[i]`, as NCCL's
    /// proxy posts one receive for the sends of several local ranks sharing the comm
    /// (`NCCL_NET_SHARED_COMMS`). `None`: not now, retry later.
    ///
    /// # Errors
    /// NULL slot, a non-success return, mismatched lengths, more buffers than `maxRecvs`, or a
    /// busy/out-of-range slot.
    pub fn irecv_group<'n>(
        &'n self,
        comm: &mut RecvComm<'n>,
        fifo: &mut Fifo<'n>,
        slots: &[usize],
        caps: &[usize],
        tags: &[i32],
    ) -> Result<Option<Request<'n>>> {
        let table = self.table()?;
        let n = slots.len();
        if n == 0 || n > MAX_GROUP || caps.len() != n || tags.len() != n {
            return Err(Error::Usage(format!(
                "grouped irecv of {n} slots, {} capacities, {} tags",
                caps.len(),
                tags.len()
            )));
        }
        if n > comm.max_recvs {
            return Err(Error::Usage(format!(
                "grouped irecv of {n} buffers on a device with maxRecvs {}: NCCL never posts more",
                comm.max_recvs
            )));
        }
        // On the stack: the proxy posts receives in its hot loop.
        let mut datas = [ptr::null_mut(); MAX_GROUP];
        let mut phandles = [ptr::null_mut(); MAX_GROUP];
        for (i, (&slot, &cap)) in slots.iter().zip(caps).enumerate() {
            if slots[..i].contains(&slot) {
                return Err(Error::Usage(format!("slot {slot} twice in one irecv")));
            }
            datas[i] = fifo.lend(comm.ptr, slot, cap)?;
            phandles[i] = fifo.phandle(slot);
        }
        let mut tag_arr = [0i32; MAX_GROUP];
        tag_arr[..n].copy_from_slice(tags);
        let mut mhandles = [fifo.mhandle; MAX_GROUP];
        let optional = NCCL_NET_OPTIONAL_RECV_COMPLETION as usize as *mut c_void;
        // NCCL's v6-v8 shims reset the preset to NULL before calling the plugin
        // (src/plugin/net/net_v6.cc … net_v8.cc); v9+ pass it through.
        let mut req: *mut c_void = if self.version >= 9 {
            optional
        } else {
            ptr::null_mut()
        };
        let start = self.call_start();
        // SAFETY: the arrays have n entries and outlive the call; every buffer lies inside the
        // registered FIFO, untouched by Rust while its slot is busy; `comm` is a live recv
        // comm; the profiler handles live in the FIFO.
        unsafe {
            table.irecv(
                comm.ptr,
                &mut datas[..n],
                caps,
                &mut tag_arr[..n],
                &mut mhandles[..n],
                &mut phandles[..n],
                &mut req,
            )
        }?;
        self.call_end(start, CallKind::irecv(!req.is_null()));
        if req == optional {
            return Err(Error::Contract(
                "irecv left *request at NCCL_NET_OPTIONAL_RECV_COMPLETION (0x1); it must be a \
                 request or NULL"
                    .into(),
            ));
        }
        let out = fifo.track(slots[0], req);
        Ok(out.map(|mut r| {
            for &s in &slots[1..] {
                fifo.busy[s] = true;
            }
            r.more = slots[1..].to_vec();
            r
        }))
    }

    /// `test`: `Some(size)` when done (the slot becomes free again), `None` while pending;
    /// `size` is what the plugin wrote, `None` if it wrote nothing (see [`Net::test_group`]).
    ///
    /// # Errors
    /// NULL slot, a non-success return, a request already completed, or the wrong FIFO.
    pub fn test<'n>(
        &'n self,
        fifo: &mut Fifo<'n>,
        req: &mut Request<'n>,
    ) -> Result<Option<Option<usize>>> {
        // No allocation: the proxies test in their hot loops.
        let mut sizes = [None; MAX_GROUP];
        let n = (1 + req.more.len()).min(MAX_GROUP);
        Ok(self
            .test_into(fifo, req, &mut sizes[..n])?
            .then_some(sizes[0]))
    }

    /// `test` of a (grouped) request: `Some(size of each buffer)` when done (its slots become
    /// free again), `None` while pending. A size is `None` when the plugin left it unwritten:
    /// the array is preset to -1, which no size can be (NCCL presets 0 and needs the sizes only
    /// for its GPU-direct flush decision and profiler, `src/transport/net.cc`, so the caller
    /// reports this rather than fails). The array has `NCCL_PROXY_MAX_SUBS` (64) entries, as
    /// NCCL's does, whatever the request's buffer count.
    ///
    /// # Errors
    /// NULL slot, a non-success return, a request already completed, the wrong FIFO, or a
    /// negative size other than the preset.
    pub fn test_group<'n>(
        &'n self,
        fifo: &mut Fifo<'n>,
        req: &mut Request<'n>,
    ) -> Result<Option<Vec<Option<usize>>>> {
        let mut sizes = vec![None; 1 + req.more.len()];
        Ok(self.test_into(fifo, req, &mut sizes)?.then_some(sizes))
    }

    /// [`Net::test_group`] writing the sizes into `out` (one entry per buffer of the request);
    /// returns whether the request is done.
    fn test_into<'n>(
        &'n self,
        fifo: &mut Fifo<'n>,
        req: &mut Request<'n>,
        out: &mut [Option<usize>],
    ) -> Result<bool> {
        let table = self.table()?;
        if req.done {
            return Err(Error::Usage("test on a completed request".into()));
        }
        if req.fifo != fifo.mem.ptr {
            return Err(Error::Usage("test with the FIFO of another request".into()));
        }
        const UNWRITTEN: c_int = -1;
        let n = 1 + req.more.len();
        if n > NCCL_PROXY_MAX_SUBS || out.len() != n {
            return Err(Error::Usage(format!(
                "test of a request of {n} buffers with {} sizes",
                out.len()
            )));
        }
        let mut sizes = [UNWRITTEN; NCCL_PROXY_MAX_SUBS];
        let start = self.call_start();
        // SAFETY: `req.ptr` is a live request (never tested to completion before); `sizes` has
        // at least as many entries as the request has buffers.
        let done = unsafe { table.test(req.ptr, &mut sizes) }?;
        self.call_end(start, CallKind::test(done));
        if !done {
            return Ok(false);
        }
        req.done = true;
        fifo.busy[req.slot] = false;
        for &s in &req.more {
            fifo.busy[s] = false;
        }
        for (o, &z) in out.iter_mut().zip(&sizes[..n]) {
            *o = match z {
                UNWRITTEN => None,
                z => Some(
                    usize::try_from(z)
                        .map_err(|_| Error::Contract(format!("test reported size {z}")))?,
                ),
            };
        }
        Ok(true)
    }

    fn owns(&self, other: &Net) -> Result<()> {
        if ptr::eq(self, other) {
            Ok(())
        } else {
            Err(Error::Usage("handle of another plugin instance".into()))
        }
    }
}

impl Drop for Net {
    /// v11+: finalizes the context of [`Net::init`] if [`Net::finalize`] was not called, as
    /// NCCL finalizes every context it made (comms borrowing `self` are gone by now).
    fn drop(&mut self) {
        let _ = self.finalize();
    }
}

/// The 128-byte opaque handle `listen` fills in and `connect` consumes.
#[derive(Clone, PartialEq, Eq)]
pub struct Handle(pub [u8; HANDLE_SIZE]);

impl Handle {
    /// All zeroes.
    pub fn zeroed() -> Handle {
        Handle([0; HANDLE_SIZE])
    }

    /// From bytes received over the bootstrap (must be exactly 128).
    pub fn from_bytes(b: &[u8]) -> Option<Handle> {
        b.try_into().ok().map(Handle)
    }
}

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Handle(")?;
        for b in &self.0[..16] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "..)")
    }
}

/// What every comm offers to [`Net::reg_mr`]/[`Net::dereg_mr`].
pub trait Comm<'n> {
    /// The raw plugin pointer.
    fn raw(&self) -> *mut c_void;
    /// The plugin it belongs to.
    fn net(&self) -> &'n Net;
}

/// A listen comm (closed with [`Net::close_listen`], or on drop).
pub struct ListenComm<'n> {
    ptr: *mut c_void,
    net: &'n Net,
    /// The device's `maxRecvs`.
    max_recvs: usize,
}

/// A connected send comm (closed with [`Net::close_send`], or on drop).
pub struct SendComm<'n> {
    ptr: *mut c_void,
    net: &'n Net,
}

/// An accepted receive comm (closed with [`Net::close_recv`], or on drop).
pub struct RecvComm<'n> {
    ptr: *mut c_void,
    net: &'n Net,
    /// The device's `maxRecvs`: the most buffers one `irecv` may carry.
    max_recvs: usize,
}

impl RecvComm<'_> {
    /// The device's `maxRecvs`: [`Net::irecv_group`] refuses more buffers, as NCCL never
    /// posts more (`src/transport/net.cc`: `recvProxyProgress` groups by `maxRecvs`).
    pub fn max_recvs(&self) -> usize {
        self.max_recvs
    }
}

impl<'n> Comm<'n> for SendComm<'n> {
    fn raw(&self) -> *mut c_void {
        self.ptr
    }
    fn net(&self) -> &'n Net {
        self.net
    }
}

impl<'n> Comm<'n> for RecvComm<'n> {
    fn raw(&self) -> *mut c_void {
        self.ptr
    }
    fn net(&self) -> &'n Net {
        self.net
    }
}

impl Drop for ListenComm<'_> {
    fn drop(&mut self) {
        // The comm is live and dropped once; errors cannot be reported from drop.
        let _ = self.net.raw_close(Close::Listen, self.ptr);
    }
}

impl Drop for SendComm<'_> {
    fn drop(&mut self) {
        let _ = self.net.raw_close(Close::Send, self.ptr);
    }
}

impl Drop for RecvComm<'_> {
    fn drop(&mut self) {
        let _ = self.net.raw_close(Close::Recv, self.ptr);
    }
}
