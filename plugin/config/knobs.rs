//! The knobs: every `VERBSNET_*` variable, declared once each.
//!
//! An entry gives the [`Config`] field (doc comment, name, type), the variable, its section of
//! docs/configuration.md, its [`Kind`] (type and accepted range), its default (the value, which
//! may be derived from the fields above it, and the text the documentation shows), its parser
//! (`v` is the variable's raw value, `parse.rs`: `v.int(None)?` is `None` when the variable is
//! unset and the default applies), how the INFO line shows the value, its documentation and
//! NCCL IB's equivalent. Adding a knob is
//! adding an entry; the order of the entries is the order of parsing, of `describe` and of
//! the documentation tables. The fields under `extra`, first, are not knobs (they come last in
//! the struct).

use std::net::IpAddr;
use std::time::Duration;

use super::parse::{show_duration, show_opt_str, Val};
use super::registry::knobs;
use super::{
    debug_default, default_rq_batch, default_rq_low_water, default_rq_min_depth, DebugLevel, Kind,
    TransportChoice, MAX_EAGER_BUF_SIZE, MAX_INLINE_SIZE, MAX_QPS_PER_CONNECTION, MAX_RQ_DEPTH,
};
use crate::ifselect::IfList;

knobs! {
    env: env;

    extra {
        /// `NCCL_SOCKET_IFNAME` as set (used when `VERBSNET_SOCKET_IFNAME` is unset).
        nccl_socket_ifname: Option<String> = env.value("NCCL_SOCKET_IFNAME"),
        /// `NCCL_SOCKET_FAMILY` as set (`AF_INET` or `AF_INET6`; other values are ignored, as
        /// NCCL does).
        nccl_socket_family: Option<String> = env.value("NCCL_SOCKET_FAMILY"),
        /// `NCCL_NET_PLUGIN_REF_COUNT` is a positive number: NCCL never unloads the plugin
        /// (`src/plugin/net.cc`), so it keeps the virtual devices it made after its last
        /// communicator (`net::forget_vdevices`).
        nccl_plugin_ref_count: bool = env
            .value("NCCL_NET_PLUGIN_REF_COUNT")
            .and_then(|v| v.trim().parse::<i64>().ok())
            .is_some_and(|n| n > 0),
        /// Tests only, never read from the environment: the sequence number of a send comm's
        /// first send and receive (production: 0). Tests start near the 29-bit immediate wrap,
        /// the CTS ring's and record ring's slot wrap, to exercise them without 2^29 messages.
        /// Keep it more than a few thousand below 2^64: a CTS entry's sequence word is `r + 1`,
        /// which is 0 (read as "not written yet") for `r = 2^64 - 1` — unreachable from 0 in
        /// practice.
        #[doc(hidden)]
        test_first_seq: u64 = 0,
        /// Tests only, never read from the environment: the generation every send request slot
        /// starts at (production: 0), so a test crosses the 24-bit generation field of
        /// `wr_id`s and the 32-bit wrap of request handles without 2^24 reuses of a slot.
        #[doc(hidden)]
        test_first_gen: u32 = 0,
        /// The communicator's `trafficClass` for one connection (`None`: NCCL passed -1, or a
        /// v7–v9 table): set per connection by the API layer from the v11+ `init` config or
        /// the v10 `connect` config, never read from the environment. `VERBSNET_IB_TC` and
        /// `VERBSNET_IB_SL` beat it when set (`crate::conn::traffic_class_and_sl`).
        comm_traffic_class: Option<u8> = None,
    }

    /// `VERBSNET_TRANSPORT`: auto | ib | tcp.
    transport: TransportChoice {
        var: "VERBSNET_TRANSPORT",
        group: Transport,
        kind: Kind::Choice(&["auto", "ib", "tcp"]),
        default: TransportChoice::Auto, "auto",
        parse: |v| v.keyword(&TransportChoice::ALL)?,
        show: |t| t.as_str().into(),
        doc: "`ib`: real verbs; `init` fails when no usable device is found. `tcp`: the userspace \
             TCP stand-in (same engine, same wire protocol). `auto` uses verbs when a usable \
             device exists and falls back to tcp otherwise, logging the choice, so one build runs \
             both on RDMA hosts and on laptops/CI.",
        nccl_ib:
            "none (NCCL picks its transport with `NCCL_NET` / `NCCL_IB_DISABLE`; select verbsnet \
             itself with `NCCL_NET_PLUGIN=verbsnet`)",
    }

    /// `VERBSNET_RQ_DEPTH`: receive WRs (and bounce buffers) per connection.
    rq_depth: u32 {
        var: "VERBSNET_RQ_DEPTH",
        group: ReceiveQueue,
        kind: Kind::Int { lo: 1, hi: MAX_RQ_DEPTH },
        default: 128, "128",
        parse: |v| v.int(None)?,
        show: |n| n.to_string(),
        doc: "The most receive WRs (and bounce buffers) a connection grows to. 128 is a common \
             driver default and comfortably above the 32 requests NCCL keeps outstanding per comm \
             (`NCCL_NET_MAX_REQUESTS`). Raise it to 512–1024 when a bursty receiver stalls (eager \
             sends waiting for credits, or RNR NAKs with credits off); the price is memory, see \
             above.",
        nccl_ib:
            "receiver QP `max_recv_wr` = 256, compile-time; NCCL IB posts one zero-byte receive \
             per `irecv` instead of a standing pool",
    }

    /// `VERBSNET_RQ_BATCH`: receive WRs posted per `post_recv` call.
    rq_batch: u32 {
        var: "VERBSNET_RQ_BATCH",
        group: ReceiveQueue,
        kind: Kind::IntBelow { lo: 1, hi: "VERBSNET_RQ_DEPTH" },
        default: default_rq_batch(rq_depth), "min(16, rq_depth)",
        parse: |v| v.int(Some(rq_depth))?,
        show: |n| n.to_string(),
        doc: "Receive WRs chained into one `ibv_post_recv` call. 16 amortizes the doorbell (one \
             MMIO write per batch) without holding many buffers back; it shrinks with a smaller \
             depth, so `VERBSNET_RQ_DEPTH=4` alone gives batch 4.",
        nccl_ib: "none (one WR per `irecv`)",
    }

    /// `VERBSNET_RQ_LOW_WATER`: refill the RQ when fewer than this many WRs are posted (at
    /// full depth; at a smaller adaptive depth, as far below it).
    rq_low_water: u32 {
        var: "VERBSNET_RQ_LOW_WATER",
        group: ReceiveQueue,
        kind: Kind::IntBelow { lo: 1, hi: "VERBSNET_RQ_DEPTH-VERBSNET_RQ_BATCH+1" },
        default: default_rq_low_water(rq_depth, rq_batch), "max(1, rq_depth - rq_batch)",
        // rq_batch <= rq_depth, so the bound is >= 1.
        parse: |v| v.int(Some(rq_depth - rq_batch + 1))?,
        show: |n| n.to_string(),
        doc: "Refill when fewer than this many receive WRs are posted. The default refills as soon \
             as one whole batch fits, keeping the queue nearly full (112 of 128 at the defaults; \
             1 at depth 4). The upper bound guarantees a refill never overfills the queue \
             (`low_water - 1 + batch ≤ depth`). A smaller value means fewer, larger refills and a \
             lower floor of posted receives.",
        nccl_ib: "none",
    }

    /// `VERBSNET_RQ_MIN_DEPTH`: receive WRs a connection starts with and shrinks back to; it
    /// grows by `rq_batch` (up to `rq_depth`) each time its RQ runs dry. `= rq_depth`: fixed.
    rq_min_depth: u32 {
        var: "VERBSNET_RQ_MIN_DEPTH",
        group: ReceiveQueue,
        kind: Kind::IntBelow { lo: 1, hi: "VERBSNET_RQ_DEPTH" },
        default: default_rq_min_depth(rq_depth), "min(2, rq_depth)",
        parse: |v| v.int(Some(rq_depth))?,
        show: |n| n.to_string(),
        doc: "Receive WRs a connection starts with and shrinks back to. 2 keeps an idle connection \
             at about 60 KiB pinned (NCCL opens one receive comm per channel per peer, thousands \
             in an alltoall); a busy one doubles its depth each time its sender waits for a \
             credit (counter `rq_grows`), so a burst costs a few credit waits, never RNR. Set it \
             to `VERBSNET_RQ_DEPTH` for a fixed depth.",
        nccl_ib: "none (NCCL IB posts one zero-byte receive per `irecv`)",
    }

    /// `VERBSNET_RQ_SHRINK_AFTER`: idle time without the RQ running dry before the depth
    /// shrinks by a batch (`None` = never).
    rq_shrink_after: Option<Duration> {
        var: "VERBSNET_RQ_SHRINK_AFTER",
        group: ReceiveQueue,
        kind: Kind::Seconds { zero: Some("never shrink") },
        default: Some(Duration::from_secs(2)), "2",
        parse: |v| v.seconds()?,
        show: |d| d.map_or("never".into(), |d| format!("{}s", d.as_secs_f64())),
        doc: "Without growing for this long, the depth shrinks by one batch towards `rq_min_depth` \
             (`rq_shrinks`). 2 s is far longer than the gaps between NCCL's steps inside a \
             collective, and short enough that an idle communicator gives its buffers back within \
             seconds. Posted WRs cannot be taken back on verbs (no \"unpost\"), so the buffers \
             above the new depth return to the pool as messages consume them, and credits stay \
             exact.",
        nccl_ib: "none",
    }

    /// `VERBSNET_RQ_POOL_SIZE`: bytes of bounce buffers the receive comms of one device in this
    /// process may grow by, together.
    rq_pool_size: u64 {
        var: "VERBSNET_RQ_POOL_SIZE",
        group: ReceiveQueue,
        kind: Kind::Bytes { hi: u32::MAX },
        default: 256 << 20, "268435456",
        parse: |v| v.int::<u32>(None)?.map(u64::from),
        show: |n| n.to_string(),
        doc: "Bytes of bounce buffers (registered in slabs of 16 as needed) that all receive comms \
             of one device in this process may grow by together. 256 MiB is about 256 receive \
             comms at the full default depth at the same time. When it is used up a queue stops \
             growing (`pool_exhausted`): credit-gated senders wait for credits, they never meet \
             RNR. `0`: every queue stays at `rq_min_depth`.",
        nccl_ib: "none",
    }

    /// `VERBSNET_EAGER_BUF_SIZE`: payload bytes of one bounce buffer.
    eager_buf_size: u32 {
        var: "VERBSNET_EAGER_BUF_SIZE",
        group: Eager,
        kind: Kind::Bytes { hi: MAX_EAGER_BUF_SIZE },
        default: 8192, "8192",
        parse: |v| v.int(None)?,
        show: |n| n.to_string(),
        doc: "Payload bytes of one bounce buffer. 8 KiB holds NCCL's small messages (LL/LL128 \
             protocol chunks, small collectives) in one SEND, and keeps the per-comm pool at \
             about 1 MiB. `0` disables the eager path entirely.",
        nccl_ib: "none (NCCL IB has no eager path: every message is a receiver-driven RDMA WRITE)",
    }

    /// `VERBSNET_EAGER_LIMIT`: largest message sent eagerly (SEND into a bounce buffer); larger
    /// ones use rendezvous (CTS, then zero-copy RDMA WRITE with immediate).
    eager_limit: u32 {
        var: "VERBSNET_EAGER_LIMIT",
        group: Eager,
        kind: Kind::BytesBelow { hi: "VERBSNET_EAGER_BUF_SIZE" },
        default: eager_buf_size, "eager_buf_size",
        parse: |v| v.int(Some(eager_buf_size))?,
        show: |n| n.to_string(),
        doc: "Largest message sent eagerly (SEND into a bounce buffer, one copy on the receiver, \
             no round trip). Larger messages use rendezvous: the receiver sends a CTS, the sender \
             does a zero-copy RDMA WRITE with immediate. The default sends everything that fits a \
             bounce buffer eagerly; lower it to trade latency for fewer copies. It follows \
             `VERBSNET_EAGER_BUF_SIZE` when only that is set; a limit above the buffer size is an \
             error naming both variables. The limit applies only to a send issued before the \
             receiver's CTS for it arrived: once the CTS is known, a send of any size is one \
             RDMA WRITE with immediate straight into the posted buffer (no bounce buffer, no \
             copy).",
        nccl_ib:
            "`NCCL_IB_AR_THRESHOLD` (8192) is the closest size threshold, but it only splits data \
             and immediate, it does not change the protocol",
    }

    /// `VERBSNET_INLINE_SIZE`: largest direct send posted inline and completed at its post;
    /// unset or `-1`: the transport's default (`INLINE_SIZE_IB`, `INLINE_SIZE_TCP`).
    inline_size: Option<u32> {
        var: "VERBSNET_INLINE_SIZE",
        group: Eager,
        kind: Kind::IntOrAuto { lo: 0, hi: MAX_INLINE_SIZE },
        default: None, "auto",
        parse: |v| v.int_or_auto()?,
        show: |n| n.map_or("auto".into(), |n| n.to_string()),
        doc: "Largest send posted inline once its receiver's CTS is known: the payload is copied \
             into the send WR when it is posted (`IBV_SEND_INLINE`; the tcp transport copies it \
             into its frame), so the request completes at once, without waiting a round trip \
             for the peer's acknowledgement, and the WR is signaled only one time in 16 \
             (`inline_sends`). Auto (unset or `-1`): 256 on ib, asked of the device at QP \
             creation (rxe grants it; a device that refuses is asked for none, with an INFO \
             line, and what it takes then caps the size), and 4096 on tcp, which copies small \
             payloads into its frames anyway. `0`: every send completes on its own completion, as NCCL IB's do. A failure of an \
             inline send after its request completed fails the comm: the next call reports \
             it. Closing the comm waits (up to 1 s) until the peer acknowledged every inline \
             send. The receive comm posts its control writes inline too when they fit: the CTS \
             entry of a one-buffer receive (64 bytes) and the credit word (8), capped by this \
             size (`0`: none).",
        nccl_ib: "none for data (NCCL IB signals every data WR and completes the request on its \
             completion); `NCCL_IB_USE_INLINE` (0) inlines only its CTS writes, as verbsnet's \
             receive comm does by default",
    }

    /// `VERBSNET_CTS_PULL`: the sender pulls clear-to-send entries with RDMA READ once it
    /// holds enough of them (1), or the receiver pushes every one (0).
    cts_pull: bool {
        var: "VERBSNET_CTS_PULL",
        group: FlowControl,
        kind: Kind::Bool,
        default: true, "1",
        parse: |v| v.bool()?,
        show: |on| if *on { "on" } else { "off" }.into(),
        doc: "How the sender learns of posted receives (set on the sending side). The receiver \
             stores each one-buffer receive's CTS entry in a mirror in its own memory and \
             RDMA-writes it to the sender only while the sender asks for that (a wake word it \
             writes). With `1` a sender holding 8 entries it has not used asks the receiver to \
             stop writing them, and when it next lacks one it RDMA-reads the whole mirror: one \
             READ brings every receive posted since the last, so a stream costs about one WR \
             per small message instead of two (the data and the CTS). A READ that finds no \
             receive is tried again after a pause (up to 3 times); one that still finds the \
             receiver behind asks it to push again, and a sender being pushed tries pulling \
             again after 32 to 1,024 pushed entries (the interval doubles while it keeps \
             finding the receiver behind). `0` keeps the receiver writing every entry \
             (`cts` on the receive line counts them; `cts_reads`, `cts_pulled` and \
             `wake_writes` count the pull). Grouped and multi-device receives are always \
             written.",
        nccl_ib: "none; NCCL IB's receiver RDMA-writes every CTS FIFO element",
    }

    /// `VERBSNET_CREDITS`: credit gating on (1) or off (0, rely on RNR retry as NCCL does).
    credits: bool {
        var: "VERBSNET_CREDITS",
        group: FlowControl,
        kind: Kind::Bool,
        default: true, "1",
        parse: |v| v.bool()?,
        show: |on| if *on { "on" } else { "off" }.into(),
        doc: "Credit gating: the receiver grants one credit per posted receive buffer and the \
             sender never has more eager SENDs in flight than credits, so an `isend` never \
             outruns the receiver's posted receives and RNR NAKs do not happen. `0` sends without \
             waiting for credits, mimicking NCCL IB, which relies on RNR retry (below) as its \
             safety net; useful to compare behaviour, or when credit returns add latency. With \
             `0` the receive comm also posts no zero-length receive WRs for its posted buffers: \
             a direct write into a posted receive may then meet an RNR NAK and rely on RNR \
             retry, and a send is no longer guaranteed to complete while the receiver makes no \
             further call (with `1` it is: docs/protocol.md, \"No send waits for the receiver's next \
             call\").",
        nccl_ib: "none; NCCL IB's CTS FIFO gates data writes, and RNR retry covers the rest",
    }

    /// `VERBSNET_RNR_TIMER`: IB-encoded minimum RNR NAK timer (0..=31).
    rnr_timer: u8 {
        var: "VERBSNET_RNR_TIMER",
        group: FlowControl,
        kind: Kind::Int { lo: 0, hi: 31 },
        default: 12, "12",
        parse: |v| v.int(None)?,
        show: |n| n.to_string(),
        doc: "Minimum RNR NAK timer our QPs advertise: how long a sender waits before retrying a \
             SEND that found no posted receive. 12 = 0.64 ms, as NCCL IB: short enough not to add \
             visible latency, long enough for the receiver to refill.",
        nccl_ib: "`min_rnr_timer = 12`, compile-time",
    }

    /// `VERBSNET_RNR_RETRY`: RNR retries (0..=7, 7 = forever).
    rnr_retry: u8 {
        var: "VERBSNET_RNR_RETRY",
        group: FlowControl,
        kind: Kind::Int { lo: 0, hi: 7 },
        default: 7, "7",
        parse: |v| v.int(None)?,
        show: |n| n.to_string(),
        doc: "How many times the HCA retries after an RNR NAK; 7 means forever, as NCCL IB. A slow \
             receiver then stalls the sender instead of killing the connection with \
             `IBV_WC_RNR_RETRY_EXC_ERR`; the hang watchdog (`VERBSNET_HANG_TIMEOUT`) reports such \
             stalls. Set 0–6 to turn an endless stall into an error while debugging.",
        nccl_ib: "`rnr_retry = 7`, compile-time",
    }

    /// `VERBSNET_IB_TIMEOUT`: IB-encoded ACK timeout (1..=31).
    ib_timeout: u8 {
        var: "VERBSNET_IB_TIMEOUT",
        group: FlowControl,
        kind: Kind::Int { lo: 1, hi: 31 },
        default: 20, "20",
        parse: |v| v.int(None)?,
        show: |n| n.to_string(),
        doc: "ACK timeout of our RC QPs: 4.096 µs × 2^20 ≈ 4.3 s, as NCCL since 2.23. Large enough \
             to ride out fabric congestion and link flaps; with the default 6 retries a silent \
             peer (powered off, cable cut) fails every outstanding WR after (6 + 1) × 4.3 s ≈ 30 \
             s. (0, \"wait forever\", is not accepted.)",
        nccl_ib: "`NCCL_IB_TIMEOUT`, default 20 since NCCL 2.23 (18 in 2.14–2.22, 14 before)",
    }

    /// `VERBSNET_IB_RETRY_CNT`: transport retries (0..=7).
    ib_retry_cnt: u8 {
        var: "VERBSNET_IB_RETRY_CNT",
        group: FlowControl,
        kind: Kind::Int { lo: 0, hi: 7 },
        default: 6, "6",
        parse: |v| v.int(None)?,
        show: |n| n.to_string(),
        doc: "Transport retries after an ACK timeout before the WR fails with \
             `IBV_WC_RETRY_EXC_ERR` (reported as `ncclRemoteError`). The bound for a silent peer \
             is (retry_cnt + 1) × ACK timeout: 7 × 4.3 s ≈ 30 s at the defaults, well under the \
             minutes after which frameworks give up on a collective (PyTorch's NCCL watchdog: 10 \
             min) and under our own `VERBSNET_HANG_TIMEOUT` (60 s), so the transport names the \
             failure before the watchdog guesses. Not 7 (NCCL's default): soft-RoCE (`rdma_rxe`) \
             treats 7 as \"retry for ever\" (its completer counts retries down only when the \
             value is not 7), so with 7 a powered-off peer is never reported on rxe; on hardware \
             NICs 7 bounds at ≈ 34 s, one retry more than 6. Measured across two VMs: \
             [troubleshooting](troubleshooting.md#a-peer-host-or-its-link-goes-silent).",
        nccl_ib: "`NCCL_IB_RETRY_CNT`, default 7",
    }

    // Traffic class and service level (issue 9; precedence and adoption: issue 23).
    /// `VERBSNET_IB_TC`: GRH traffic class of RC QPs (0..=255); `None` (unset, or -1): the
    /// communicator's `trafficClass`, else 0 (`crate::conn::traffic_class_and_sl`).
    ib_tc: Option<u8> {
        var: "VERBSNET_IB_TC",
        group: FlowControl,
        kind: Kind::IntOrAuto { lo: 0, hi: 255 },
        default: None, "auto",
        parse: |v| v.int_or_auto()?.map(|t| t.map(|n| n as u8)),
        show: |t| t.map_or("auto".into(), |t| t.to_string()),
        doc: "The GRH traffic class of a connection's RC QPs (on RoCE the IP header's DSCP/ECN \
             byte: DSCP 26 is `104`, with ECN-capable `106`). Set, it beats the communicator's \
             `trafficClass`, as `NCCL_IB_TC` does in NCCL IB (`net_ib/connect.cc`). Auto (unset \
             or `-1`): the communicator's `trafficClass` when NCCL passes one (not -1: the \
             v11/v12 `init` config, the v10 `connect` config; `ncclConfig_t.trafficClass`), \
             else 0. The connecting side decides and the accepting side adopts its value (the \
             handshake carries it), as NCCL IB's receiver does, so both ends of a connection \
             use one class whatever the receiver's own setting. Each connection's INFO line \
             prints the value in effect on that end (`traffic class N SL M`). On InfiniBand it \
             only matters when the path uses a GRH.",
        nccl_ib: "`NCCL_IB_TC`, default -1 (the communicator's `trafficClass`, else 0)",
    }

    /// `VERBSNET_IB_SL`: service level of RC QPs (0..=15); `None` (unset, or -1): the
    /// communicator's `trafficClass` (its low 4 bits), else 0.
    ib_sl: Option<u8> {
        var: "VERBSNET_IB_SL",
        group: FlowControl,
        kind: Kind::IntOrAuto { lo: 0, hi: 15 },
        default: None, "auto",
        parse: |v| v.int_or_auto()?.map(|t| t.map(|n| n as u8)),
        show: |t| t.map_or("auto".into(), |t| t.to_string()),
        doc: "The service level of a connection's RC QPs (address vector `sl`; InfiniBand \
             fabrics map it to virtual lanes, mlx5 RoCE ports take its low 3 bits as the \
             802.1p priority). Set, it beats everything, as `NCCL_IB_SL`. Auto (unset or \
             `-1`): NCCL IB's rule (`net_ib/connect.cc`), the communicator's `trafficClass` \
             when NCCL passes one, used as the SL (its low 4 bits: the SL field is 4 bits wide, \
             and what mlx5 keeps of NCCL IB's unmasked value), else 0. `VERBSNET_IB_TC` does \
             not feed it. The accepting side adopts the connecting side's SL; each \
             connection's INFO line prints it.",
        nccl_ib: "`NCCL_IB_SL`, default -1 (the communicator's `trafficClass`, else 0)",
    }

    // Several QPs per connection (issue 23).
    /// `VERBSNET_IB_QPS_PER_CONNECTION`: QPs of one connection (1..=128); unset: the value
    /// of `NCCL_IB_QPS_PER_CONNECTION`, else 1. The connecting side's value decides.
    ib_qps_per_connection: u8 {
        var: "VERBSNET_IB_QPS_PER_CONNECTION",
        group: FlowControl,
        kind: Kind::Int { lo: 1, hi: MAX_QPS_PER_CONNECTION },
        default: 1, "1",
        parse: |v| match v.int(None)? {
            Some(n) => Some(n),
            None => Val::new(
                "NCCL_IB_QPS_PER_CONNECTION",
                Kind::Int { lo: 1, hi: MAX_QPS_PER_CONNECTION },
                env.value("NCCL_IB_QPS_PER_CONNECTION"),
            )
            .int(None)?,
        },
        show: |n| n.to_string(),
        doc: "QPs one connection spreads over (the tcp transport too, despite the name: each QP \
             is its own TCP stream there). QP 0 carries everything a one-QP connection carries \
             (eager sends, direct writes with immediate, CTS and credit writes, the receive \
             queue); a direct send also writes its payload on QPs 1 and up, round robin or \
             split (`VERBSNET_IB_SPLIT_DATA_ON_QPS`), as RDMA WRITE WITH IMMs posted at once \
             with the one on QP 0, each consuming a zero-length receive WR the receiver keeps \
             on that QP. On a real fabric it buys ECMP entropy (each QP is its own flow, hashed \
             onto its own path; RoCE v2 varies the UDP source port per QP) and gets past per-QP \
             limits (one QP's outstanding reads, its processing unit on the NIC). On soft-RoCE \
             (rxe) it buys nothing: rxe is CPU bound, not path bound. The cost: a message on a \
             data QP is 2 WRs (its payload there, a zero-length one on QP 0), a split one a WR \
             and a receive completion per QP, and every QP costs a QP, a CQ and (tcp) a socket \
             per connection. The connecting (sending) side's value decides for the connection: \
             the receiver adopts it, and logs at INFO when its own setting differs (NCCL IB \
             takes the larger of both sides' counts; verbsnet does not). A connection to or \
             from a virtual device (`makeVDevice`, NIC fusion) has this many QPs per device of \
             the side with more devices, as NCCL IB, QP `q` on device `q % devices` of each \
             side; the product is at most 128. Unset: `NCCL_IB_QPS_PER_CONNECTION` when set, \
             else 1.",
        nccl_ib: "`NCCL_IB_QPS_PER_CONNECTION`, default 1; NCCL IB uses the larger of both \
                  sides' values (`net_ib/connect.cc`)",
    }

    /// `VERBSNET_IB_SPLIT_DATA_ON_QPS`: split each direct send evenly over all QPs of its
    /// connection (on), or send each whole on one QP, round robin (off); unset: the value of
    /// `NCCL_IB_SPLIT_DATA_ON_QPS`, else off.
    ib_split_data_on_qps: bool {
        var: "VERBSNET_IB_SPLIT_DATA_ON_QPS",
        group: FlowControl,
        kind: Kind::Bool,
        default: false, "0",
        parse: |v| match v.bool()? {
            Some(b) => Some(b),
            None => Val::new(
                "NCCL_IB_SPLIT_DATA_ON_QPS",
                Kind::Bool,
                env.value("NCCL_IB_SPLIT_DATA_ON_QPS"),
            )
            .bool()?,
        },
        show: |b| if *b { "on".into() } else { "off".into() },
        doc: "With several QPs per connection (`VERBSNET_IB_QPS_PER_CONNECTION`): on, each \
             direct (rendezvous) send is cut into one piece per QP (128-byte aligned; QPs past \
             the end of a small message get a zero-length write) written on all QPs at once; \
             off, each send goes whole on one QP, the QP of its receive buffer's index modulo \
             the QP count (round robin). On suits few large messages, off many (less work per \
             message). Applies to \
             the tcp transport too. The connecting side's value decides for the connection, as \
             for the QP count. Unset: `NCCL_IB_SPLIT_DATA_ON_QPS` when set, else off. Without \
             data QPs it has no effect.",
        nccl_ib: "`NCCL_IB_SPLIT_DATA_ON_QPS`, default 0 (`net_ib/common.cc`)",
    }

    /// `VERBSNET_IB_MERGE_NICS`: `makeVDevice` may join several devices into one (on); unset:
    /// the value of `NCCL_IB_MERGE_NICS`, else on.
    ib_merge_nics: bool {
        var: "VERBSNET_IB_MERGE_NICS",
        group: Devices,
        kind: Kind::Bool,
        default: true, "1",
        parse: |v| match v.bool()? {
            Some(b) => Some(b),
            None => Val::new(
                "NCCL_IB_MERGE_NICS",
                Kind::Bool,
                env.value("NCCL_IB_MERGE_NICS"),
            )
            .bool()?,
        },
        show: |b| if *b { "on".into() } else { "off".into() },
        doc: "NIC fusion: NCCL (2.24+, ncclNet v9+) asks the plugin to join devices close to \
             each other (the two ports of a dual-port card, by default; `NCCL_NET_MERGE_LEVEL`, \
             `NCCL_NET_FORCE_MERGE`) into one virtual device through `makeVDevice`, and then \
             uses it like any device: a connection on it spreads its QPs over the devices (QP \
             `q` on device `q % devices`, `VERBSNET_IB_QPS_PER_CONNECTION` QPs per device), \
             buffers are registered on each, and its speed is their sum. Off, `makeVDevice` of \
             more than one device is refused and NCCL keeps the devices apart (its automatic \
             fusion falls back; `NCCL_NET_FORCE_MERGE` fails). Unset: `NCCL_IB_MERGE_NICS` \
             when set, else on.",
        nccl_ib: "`NCCL_IB_MERGE_NICS`, default 1 (`net_ib/init.cc`)",
    }

    /// `VERBSNET_TCP_DEVICES`: devices the tcp transport exposes (1..=8).
    tcp_devices: u8 {
        var: "VERBSNET_TCP_DEVICES",
        group: Devices,
        kind: Kind::Int { lo: 1, hi: 8 },
        default: 1, "1",
        parse: |v| v.int(None)?,
        show: |n| n.to_string(),
        doc: "Devices the tcp transport exposes (`tcp0` … `tcpN-1`), each with its own memory \
             keys, all over the same loopback or interface: a host without RDMA can then \
             exercise what NCCL does with several NICs (a connection per device, NIC fusion \
             through `makeVDevice`, whose connections must use each device's keys on that \
             device's QPs). They add no bandwidth. No effect on `ib`.",
        nccl_ib: "none (NCCL's socket transport exposes one device per interface)",
    }

    /// `VERBSNET_IB_HCA`: device filter (`[^][=]name[:port],...`).
    ib_hca: Option<String> {
        var: "VERBSNET_IB_HCA",
        group: Devices,
        kind: Kind::Text("a non-empty device list [^][=]name[:port],..."),
        default: None, "all active ports",
        parse: |v| v.text_if(|_| true)?.map(Some),
        show: |s| show_opt_str(s.as_deref(), "all"),
        doc: "Which verbs devices and ports to use. Same syntax as NCCL: a prefix match by default \
             (`mlx5_1` also matches `mlx5_10`), `=` for exact names, `^` to exclude, `:port` for \
             one port. Unset uses every ACTIVE port.",
        nccl_ib: "`NCCL_IB_HCA`, default all",
    }

    /// `VERBSNET_IB_GID_INDEX`: force a GID index (default: automatic RoCE v2 IPv4 choice).
    ib_gid_index: Option<u32> {
        var: "VERBSNET_IB_GID_INDEX",
        group: Devices,
        kind: Kind::IntOrAuto { lo: 0, hi: 255 },
        default: None, "auto",
        parse: |v| v.int_or_auto()?,
        show: |g| g.map_or("auto".into(), |g| g.to_string()),
        doc: "Force the GID table index on RoCE. Auto picks a RoCE v2 GID holding an IPv4-mapped \
             address, as NCCL does, which is right for routed RoCE v2 fabrics; force an index \
             when the host has several and auto picks the wrong one. `-1` is accepted so NCCL \
             settings can be copied verbatim.",
        nccl_ib: "`NCCL_IB_GID_INDEX`, default -1 (auto, RoCE v2, `AF_INET`)",
    }

    /// `VERBSNET_SOCKET_ADDR`: IP address for the out-of-band listener (and tcp data).
    socket_addr: Option<IpAddr> {
        var: "VERBSNET_SOCKET_ADDR",
        group: Devices,
        kind: Kind::Text("an IPv4 or IPv6 address, e.g. 10.0.0.1 or fd00::1"),
        default: None, "auto",
        parse: |v| v.parsed::<IpAddr>()?.map(Some),
        show: |a| a.map_or("auto".into(), |a| a.to_string()),
        doc: "The local address of the out-of-band listener that exchanges connection metadata \
             (and, with `tcp`, of the data sockets). When set it is used as is and no interface \
             is chosen. Auto chooses an interface as below.",
        nccl_ib: "none (NCCL takes the address of `NCCL_SOCKET_IFNAME`)",
    }

    /// `VERBSNET_SOCKET_IFNAME`: interface list (`[^][=]name,...`, NCCL_SOCKET_IFNAME's
    /// syntax) whose first address the listener uses; see [`crate::ifselect`].
    socket_ifname: Option<String> {
        var: "VERBSNET_SOCKET_IFNAME",
        group: Devices,
        kind: Kind::Text(
            "an interface list as NCCL_SOCKET_IFNAME: [^][=]name[,name...] (prefixes)",
        ),
        default: None, "auto",
        parse: |v| v.text_if(|s| IfList::parse(s).is_ok())?.map(Some),
        show: |s| show_opt_str(s.as_deref(), "auto"),
        doc: "The interfaces whose first address the listener uses; takes precedence over \
             `NCCL_SOCKET_IFNAME`. See [the set-up interface](#the-set-up-interface) below.",
        nccl_ib: "`NCCL_SOCKET_IFNAME`",
    }

    /// `VERBSNET_SOCKET_KEEPALIVE`: bound for noticing a silent peer host on an ib
    /// connection's set-up socket with TCP keepalive (0 = off).
    socket_keepalive: Option<Duration> {
        var: "VERBSNET_SOCKET_KEEPALIVE",
        group: Devices,
        kind: Kind::Seconds { zero: Some("off") },
        default: Some(Duration::from_secs(20)), "20",
        parse: |v| v.seconds()?,
        show: |d| show_duration(*d),
        doc: "TCP keepalive on the set-up socket of every connection (ib; tcp: its data stream, \
             while idle), so that a peer **host** \
             that goes silent (power loss, cut link: no FIN) fails the comm's requests with \
             `ncclRemoteError` within this bound even when no WR is in flight for the transport's \
             retry budget to expire (a receive never times out; a sender waiting for a CTS posts \
             nothing). First probe after half the bound idle, then every tenth, five unanswered: \
             10 s + 5 × 2 s at the default. The peer's kernel answers, so a busy peer process \
             never trips it. 20 s: under the transport's ≈ 30 s budget and far under framework \
             timeouts; measured 14–17 s across two VMs \
             ([troubleshooting](troubleshooting.md#a-peer-host-or-its-link-goes-silent)).",
        nccl_ib: "none (NCCL IB relies on the QP's retry budget only)",
    }

    /// `VERBSNET_HANG_TIMEOUT`: seconds without progress before the watchdog WARNs (0 = off).
    hang_timeout: Option<Duration> {
        var: "VERBSNET_HANG_TIMEOUT",
        group: Diagnostics,
        kind: Kind::Seconds { zero: Some("off") },
        default: Some(Duration::from_secs(60)), "60",
        parse: |v| v.seconds()?,
        show: |d| show_duration(*d),
        doc: "A request that makes no progress for this long is reported with a WARN instead of \
             hanging silently. 60 s is well above the transport retry budget at the defaults \
             (about 30 s, see `VERBSNET_IB_RETRY_CNT`), so a report means a real stall, typically \
             endless RNR retry or a peer that stopped posting receives.",
        nccl_ib: "none (NCCL IB hangs silently on infinite RNR retry)",
    }

    /// `VERBSNET_STATS_INTERVAL`: seconds between periodic counter lines (0 = off).
    stats_interval: Option<Duration> {
        var: "VERBSNET_STATS_INTERVAL",
        group: Diagnostics,
        kind: Kind::Seconds { zero: Some("off") },
        default: None, "0",
        parse: |v| v.seconds()?,
        show: |d| show_duration(*d),
        doc: "Seconds between periodic INFO lines with the plugin's counters. Off by default: it \
             is a debugging aid and the lines are noisy.",
        nccl_ib: "none",
    }

    /// `VERBSNET_STATS_FILE`: file each comm appends one JSON line of counters to when it closes.
    stats_file: Option<String> {
        var: "VERBSNET_STATS_FILE",
        group: Diagnostics,
        kind: Kind::Text("a file path"),
        default: None, "unset",
        parse: |v| v.text_if(|_| true)?.map(Some),
        show: |s| show_opt_str(s.as_deref(), "off"),
        doc: "When set, every comm appends one JSON object with its counters (side, ops, bytes, \
             eager, rendezvous, credit_stalls, cts_waits, rq_post_calls, rq_wrs_posted, \
             rq_min_level, RNR counters, ...) to this file as it closes; with ncclNet v11/v12 the \
             object also names its communicator (`\"comm_id\": \"0x…\"`, NCCL's `commId`), so \
             counters can be grouped per communicator. The `dev_*` RNR counters are device-wide \
             (every QP on the port) and given as moved while the comm existed. See \
             [troubleshooting](troubleshooting.md) for reading them. `verbsnet-perf --stats` uses \
             it.",
        nccl_ib: "none",
    }

    /// `VERBSNET_DEBUG`: how much the plugin logs. Default `warn`, or `info` when
    /// `NCCL_DEBUG` is `INFO` or `TRACE` and `VERBSNET_DEBUG` is unset.
    debug: DebugLevel {
        var: "VERBSNET_DEBUG",
        group: Diagnostics,
        kind: Kind::Choice(&["none", "warn", "info", "debug", "trace"]),
        default: debug_default(env.value("NCCL_DEBUG").as_deref()),
            "warn (info when NCCL_DEBUG is INFO or TRACE)",
        parse: |v| v.keyword(&DebugLevel::ALL)?,
        show: |l| l.as_str().into(),
        doc: "How much the plugin logs; see [Logging](#logging-verbsnet_debug-and-nccl_debug).",
        nccl_ib: "`NCCL_DEBUG` (see below)",
    }

    // Connection set-up and peer liveness (issue 12).
    /// `VERBSNET_CONNECT_TIMEOUT`: longest a `connect` or an `accept` may take before it fails
    /// naming the peer and the stage reached (`None` = no deadline).
    connect_timeout: Option<Duration> {
        var: "VERBSNET_CONNECT_TIMEOUT",
        group: Setup,
        kind: Kind::Seconds { zero: Some("no deadline") },
        default: Some(Duration::from_secs(120)), "120",
        parse: |v| v.seconds()?,
        show: |d| show_duration(*d),
        doc: "Longest a `connect` or an `accept` may take. A `connect` that has not finished fails \
             with `ncclRemoteError` naming the listener's address and the stage reached (TCP \
             connect, handshake, QP exchange, RTR/RTS); an `accept` that completed no connection \
             for this long fails naming what the pending handshakes reached. 120 s is twice \
             NCCL's own socket connect retry window (`NCCL_SOCKET_RETRY_CNT`=34 × \
             `NCCL_SOCKET_RETRY_SLEEP_MSEC`, `src/misc/socket.cc`), so a rank that starts late \
             still makes it, while a dead or unreachable peer is an error instead of a silent \
             hang (a kernel SYN retry alone takes about 127 s). The hang watchdog \
             (`VERBSNET_HANG_TIMEOUT`) reports a connect or accept without progress first. \
             Connections that have not shown the listen comm's nonce are dropped after 10 s (or \
             this value when shorter).",
        nccl_ib: "none: NCCL IB's connect/accept have no deadline",
    }

    /// `VERBSNET_PEER_CHECK_INTERVAL`: how often a comm asks the set-up socket whether the peer
    /// closed, on any call, with or without work outstanding.
    peer_check_interval: Duration {
        var: "VERBSNET_PEER_CHECK_INTERVAL",
        group: Setup,
        kind: Kind::Seconds { zero: None },
        default: Duration::from_secs(1), "1",
        parse: |v| v.positive_seconds()?,
        show: |d| format!("{}s", d.as_secs_f64()),
        doc: "How often a comm asks its set-up socket whether the peer closed. The data path \
             (`isend`/`irecv`/`test`) makes no system call of its own: a dead peer is learnt from \
             the transport (error completions; on tcp the data stream's EOF) and from this check, \
             made at most once per interval on any call (`isend`, `irecv`, `test`), also when \
             nothing is in flight: an `isend` answering \"retry later\" while it waits for a \
             credit or a CTS learns this way that the peer died or closed. 1 s bounds how late a \
             peer's exit is noticed when the transport says nothing (ib: the peer's QP is gone \
             but nothing was outstanding), at one `read` per second per comm.",
        nccl_ib: "none (NCCL IB learns peer death from completions only)",
    }
}
