//! Pure conversions between verbs codes and our types (unit-tested without hardware).

use rdma_sys::{ibv_mtu, ibv_wc_opcode, ibv_wc_status};

use crate::transport::{WcOpcode, WcStatus};

/// Bytes of an `ibv_mtu` code (1 = 256 ... 5 = 4096); `None` for anything else.
pub fn mtu_bytes(code: u32) -> Option<u32> {
    match code {
        ibv_mtu::IBV_MTU_256 => Some(256),
        ibv_mtu::IBV_MTU_512 => Some(512),
        ibv_mtu::IBV_MTU_1024 => Some(1024),
        ibv_mtu::IBV_MTU_2048 => Some(2048),
        ibv_mtu::IBV_MTU_4096 => Some(4096),
        _ => None,
    }
}

/// The `ibv_mtu` code of a byte count (the largest not above it; at least 256).
pub fn mtu_code(bytes: u32) -> u32 {
    match bytes {
        4096.. => ibv_mtu::IBV_MTU_4096,
        2048.. => ibv_mtu::IBV_MTU_2048,
        1024.. => ibv_mtu::IBV_MTU_1024,
        512.. => ibv_mtu::IBV_MTU_512,
        _ => ibv_mtu::IBV_MTU_256,
    }
}

/// Path MTU of a connection: the smaller of both ports' active MTUs (as `ibv_mtu` codes, whose
/// order follows the byte counts). Unknown codes count as 1024, the smallest MTU any RoCE port
/// uses in practice.
pub fn path_mtu(local: u32, remote: u32) -> u32 {
    let known = |c: u32| {
        if mtu_bytes(c).is_some() {
            c
        } else {
            ibv_mtu::IBV_MTU_1024
        }
    };
    known(local).min(known(remote))
}

/// Per-lane rates in Mbps by speed bit, as NCCL IB's table (`ibvSpeeds`,
/// `src/transport/net_ib/init.cc`, NCCL 2.30.7): bit 0 SDR, 1 DDR, 2 QDR, 3 FDR10, 4 FDR,
/// 5 EDR, 6 HDR, 7 NDR, 8 XDR (`IBV_SPEED_XDR` = 0x100, only in `active_speed_ex`).
const LANE_MBPS: [u32; 9] = [
    2_500, 5_000, 10_000, 10_000, 14_000, 25_000, 50_000, 100_000, 200_000,
];

/// Lanes by width bit (`ibvWidths`, same file): bit 0 1x, 1 4x, 2 8x, 3 12x, 4 2x.
const WIDTH_LANES: [u32; 5] = [1, 4, 8, 12, 2];

/// Index of the lowest set bit of `code`, at most `max` (NCCL IB's `firstBitSet`: a code with
/// no bit below `max` set, 0 included, reads as `max`).
fn first_bit_set(code: u32, max: usize) -> usize {
    (0..max).find(|&i| code & (1 << i) != 0).unwrap_or(max)
}

/// Per-lane rate in Mbps of a speed code (`active_speed_ex` when non-zero, else
/// `active_speed`), by NCCL IB's rule (`ncclIbSpeed`, `net_ib/init.cc`): the lowest set bit
/// picks the entry, and a code past the table — a speed newer than XDR, or 0 — reads as the
/// last entry, XDR's 200 Gb/s per lane, never as something slower.
pub fn lane_speed_mbps(speed: u32) -> u32 {
    LANE_MBPS[first_bit_set(speed, LANE_MBPS.len() - 1)]
}

/// Lanes of an `active_width` code by NCCL IB's rule (`ncclIbWidth`): the lowest set bit picks
/// the entry; an unknown code reads as the last entry (2x).
pub fn width_lanes(width: u8) -> u32 {
    WIDTH_LANES[first_bit_set(u32::from(width), WIDTH_LANES.len() - 1)]
}

/// True when `speed` is one speed the table names (one bit, SDR … XDR).
pub fn speed_code_known(speed: u32) -> bool {
    speed.is_power_of_two() && speed <= 1 << (LANE_MBPS.len() - 1)
}

/// True when `width` is one width the table names (one bit, 1x … 2x).
pub fn width_code_known(width: u8) -> bool {
    width.is_power_of_two() && u32::from(width) <= 1 << (WIDTH_LANES.len() - 1)
}

/// The speed code NCCL IB reads (`net_ib/init.cc`): `active_speed_ex` when non-zero (rdma-core
/// 49+ and a kernel that reports it: XDR and newer only fit there), else `active_speed`.
pub fn speed_code(active_speed: u8, active_speed_ex: u32) -> u32 {
    if active_speed_ex != 0 {
        active_speed_ex
    } else {
        u32::from(active_speed)
    }
}

/// Port speed in Mbps as NCCL IB reports it (`ncclIbInitDevices`, `net_ib/init.cc`, NCCL
/// 2.30.7): `ibv_query_port_speed`'s effective bandwidth (units of 100 Mb/s) when the library
/// exports it and the device answers, else lane rate × lanes of the speed code
/// ([`speed_code`]) and `active_width`. Saturates at `i32::MAX` (NCCL's `speed` is an `int`).
pub fn port_speed_mbps(queried_100mbps: Option<u64>, speed: u32, active_width: u8) -> i32 {
    let mbps = match queried_100mbps {
        Some(q) => q.saturating_mul(100),
        None => u64::from(lane_speed_mbps(speed)) * u64::from(width_lanes(active_width)),
    };
    i32::try_from(mbps).unwrap_or(i32::MAX)
}

/// Our status for an `ibv_wc_status` code.
pub fn wc_status(code: u32) -> WcStatus {
    match code {
        ibv_wc_status::IBV_WC_SUCCESS => WcStatus::Success,
        ibv_wc_status::IBV_WC_LOC_LEN_ERR => WcStatus::LocalLength,
        ibv_wc_status::IBV_WC_LOC_PROT_ERR => WcStatus::LocalProtection,
        ibv_wc_status::IBV_WC_LOC_QP_OP_ERR => WcStatus::LocalQpOperation,
        ibv_wc_status::IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlush,
        ibv_wc_status::IBV_WC_REM_ACCESS_ERR => WcStatus::RemoteAccess,
        ibv_wc_status::IBV_WC_REM_INV_REQ_ERR => WcStatus::RemoteInvalidRequest,
        ibv_wc_status::IBV_WC_REM_OP_ERR => WcStatus::RemoteOperation,
        ibv_wc_status::IBV_WC_RETRY_EXC_ERR => WcStatus::RetryExceeded,
        ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExceeded,
        other => WcStatus::Other(other),
    }
}

/// Our opcode for an `ibv_wc_opcode` code. Verbs define the opcode only for successful
/// completions; for others (rxe does fill it) codes with the receive bit (128) map to
/// [`WcOpcode::Recv`] and the rest to [`WcOpcode::Send`], so a flushed WR is at least
/// attributed to the right queue.
pub fn wc_opcode(code: u32) -> WcOpcode {
    match code {
        ibv_wc_opcode::IBV_WC_SEND => WcOpcode::Send,
        ibv_wc_opcode::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
        ibv_wc_opcode::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
        ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        c if c & ibv_wc_opcode::IBV_WC_RECV != 0 => WcOpcode::Recv,
        _ => WcOpcode::Send,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_codes_round_trip() {
        for (code, bytes) in [(1, 256), (2, 512), (3, 1024), (4, 2048), (5, 4096)] {
            assert_eq!(mtu_bytes(code), Some(bytes));
            assert_eq!(mtu_code(bytes), code);
        }
        assert_eq!(mtu_bytes(0), None);
        assert_eq!(mtu_bytes(6), None);
        assert_eq!(mtu_code(9000), ibv_mtu::IBV_MTU_4096);
        assert_eq!(mtu_code(1500), ibv_mtu::IBV_MTU_1024);
        assert_eq!(mtu_code(100), ibv_mtu::IBV_MTU_256);
    }

    #[test]
    fn path_mtu_is_the_minimum() {
        assert_eq!(path_mtu(5, 3), 3);
        assert_eq!(path_mtu(3, 5), 3);
        assert_eq!(path_mtu(5, 5), 5);
        assert_eq!(path_mtu(5, 0), ibv_mtu::IBV_MTU_1024);
        assert_eq!(path_mtu(2, 99), 2);
    }

    /// IB spec speed codes × widths (`ibv_port_attr`), as `ibv_devinfo` names them; the rate
    /// NCCL IB reports for each.
    #[test]
    fn speeds_follow_nccl_ibs_table() {
        // (speed code, name, Gb/s per lane)
        let speeds = [
            (1, "SDR", 2.5),
            (2, "DDR", 5.0),
            (4, "QDR", 10.0),
            (8, "FDR10", 10.0),
            (16, "FDR", 14.0),
            (32, "EDR", 25.0),
            (64, "HDR", 50.0),
            (128, "NDR", 100.0),
            (256, "XDR", 200.0),
        ];
        // (width code, lanes)
        let widths = [(1u8, 1u32), (2, 4), (4, 8), (8, 12), (16, 2)];
        for (code, name, gbps) in speeds {
            assert!(speed_code_known(code), "{name}");
            for (w, lanes) in widths {
                let want = (gbps * 1000.0) as i32 * lanes as i32;
                // active_speed holds codes up to NDR; XDR only fits active_speed_ex
                let (legacy, ex) = if code <= 128 {
                    (code as u8, 0)
                } else {
                    (0, code)
                };
                assert_eq!(
                    port_speed_mbps(None, speed_code(legacy, ex), w),
                    want,
                    "{name} {lanes}x"
                );
            }
        }
        assert_eq!(port_speed_mbps(None, 32, 2), 100_000); // EDR 4x
        assert_eq!(port_speed_mbps(None, 1, 1), 2_500); // SDR 1x (rxe's default)
        assert_eq!(port_speed_mbps(None, 256, 2), 800_000); // XDR 4x
        assert_eq!(port_speed_mbps(None, 128, 16), 200_000); // NDR 2x
    }

    #[test]
    fn an_xdr_port_is_never_read_as_slower() {
        // active_speed_ex beats a stale active_speed
        assert_eq!(speed_code(0, 0x100), 0x100);
        assert_eq!(speed_code(32, 0), 32);
        assert_eq!(speed_code(128, 0x100), 0x100);
        // an XDR port whose library fills only the 8-bit active_speed (0: no code fits) reads
        // as XDR, as in NCCL IB: the table's last entry, not 10 Gb/s
        assert_eq!(port_speed_mbps(None, speed_code(0, 0), 2), 800_000);
        // a code newer than XDR (0x200) reads as XDR too
        assert_eq!(port_speed_mbps(None, 0x200, 2), 800_000);
        assert!(!speed_code_known(0) && !speed_code_known(0x200) && !speed_code_known(3));
        // several bits: the lowest wins (NCCL's firstBitSet)
        assert_eq!(lane_speed_mbps(32 | 64), 25_000);
        // unknown widths read as 2x, the table's last entry
        assert_eq!(width_lanes(0), 2);
        assert_eq!(width_lanes(32), 2);
        assert!(width_code_known(16) && !width_code_known(3) && !width_code_known(32));
        // ibv_query_port_speed (100 Mb/s units) beats the codes
        assert_eq!(port_speed_mbps(Some(8000), 1, 1), 800_000);
        assert_eq!(port_speed_mbps(Some(u64::MAX), 1, 1), i32::MAX);
    }

    #[test]
    fn statuses() {
        use ibv_wc_status::*;
        let table = [
            (IBV_WC_SUCCESS, WcStatus::Success),
            (IBV_WC_LOC_LEN_ERR, WcStatus::LocalLength),
            (IBV_WC_LOC_PROT_ERR, WcStatus::LocalProtection),
            (IBV_WC_LOC_QP_OP_ERR, WcStatus::LocalQpOperation),
            (IBV_WC_WR_FLUSH_ERR, WcStatus::WrFlush),
            (IBV_WC_REM_ACCESS_ERR, WcStatus::RemoteAccess),
            (IBV_WC_REM_INV_REQ_ERR, WcStatus::RemoteInvalidRequest),
            (IBV_WC_REM_OP_ERR, WcStatus::RemoteOperation),
            (IBV_WC_RETRY_EXC_ERR, WcStatus::RetryExceeded),
            (IBV_WC_RNR_RETRY_EXC_ERR, WcStatus::RnrRetryExceeded),
            (IBV_WC_FATAL_ERR, WcStatus::Other(IBV_WC_FATAL_ERR)),
        ];
        for (code, want) in table {
            assert_eq!(wc_status(code), want, "code {code}");
        }
        // the numeric values are ABI (verbs.h): spot-check two
        assert_eq!(IBV_WC_REM_ACCESS_ERR, 10);
        assert_eq!(IBV_WC_RNR_RETRY_EXC_ERR, 13);
    }

    #[test]
    fn opcodes() {
        use ibv_wc_opcode::*;
        assert_eq!(wc_opcode(IBV_WC_SEND), WcOpcode::Send);
        assert_eq!(wc_opcode(IBV_WC_RDMA_WRITE), WcOpcode::RdmaWrite);
        assert_eq!(wc_opcode(IBV_WC_RDMA_READ), WcOpcode::RdmaRead);
        assert_eq!(wc_opcode(IBV_WC_RECV), WcOpcode::Recv);
        assert_eq!(
            wc_opcode(IBV_WC_RECV_RDMA_WITH_IMM),
            WcOpcode::RecvRdmaWithImm
        );
        // codes we never post map to the send queue
        assert_eq!(wc_opcode(IBV_WC_COMP_SWAP), WcOpcode::Send);
    }
}
