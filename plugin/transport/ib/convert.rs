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

/// Per-lane signalling rate in Mbps of an `active_speed` code of `ibv_port_attr`.
pub fn lane_speed_mbps(active_speed: u8) -> Option<u32> {
    Some(match active_speed {
        1 => 2_500,     // SDR
        2 => 5_000,     // DDR
        4 => 10_000,    // QDR
        8 => 10_000,    // FDR10
        16 => 14_000,   // FDR
        32 => 25_000,   // EDR
        64 => 50_000,   // HDR
        128 => 100_000, // NDR
        _ => return None,
    })
}

/// Lanes of an `active_width` code of `ibv_port_attr`.
pub fn width_lanes(active_width: u8) -> Option<u32> {
    Some(match active_width {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => return None,
    })
}

/// Port speed in Mbps (lane rate × lanes); `None` when a code is unknown.
pub fn port_speed_mbps(active_speed: u8, active_width: u8) -> Option<u32> {
    Some(lane_speed_mbps(active_speed)? * width_lanes(active_width)?)
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

    #[test]
    fn speeds() {
        assert_eq!(port_speed_mbps(32, 2), Some(100_000)); // EDR 4x
        assert_eq!(port_speed_mbps(64, 2), Some(200_000)); // HDR 4x
        assert_eq!(port_speed_mbps(1, 1), Some(2_500)); // SDR 1x (rxe reports this by default)
        assert_eq!(port_speed_mbps(128, 16), Some(200_000)); // NDR 2x
        assert_eq!(port_speed_mbps(3, 1), None);
        assert_eq!(port_speed_mbps(1, 3), None);
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
        assert_eq!(wc_opcode(IBV_WC_RECV), WcOpcode::Recv);
        assert_eq!(
            wc_opcode(IBV_WC_RECV_RDMA_WITH_IMM),
            WcOpcode::RecvRdmaWithImm
        );
        assert_eq!(wc_opcode(IBV_WC_RDMA_READ), WcOpcode::Send);
    }
}
