//! The 128-byte handle `listen` fills and NCCL ships to the connecting peer, which passes it
//! to `connect` (every call of one connect gets the same buffer).
//!
//! ## Layout (little-endian)
//! | off | size | field |
//! |----:|-----:|-------|
//! | 0 | 8 | magic `VNETHDL1` |
//! | 8 | 8 | nonce (random per listen comm; a connection with another nonce is refused) |
//! | 16 | 1 | address family (4 or 6) |
//! | 17 | 1 | transport (1 = ib, 2 = tcp) |
//! | 18 | 2 | TCP port |
//! | 20 | 16 | IP address (IPv4 in the first 4 bytes) |
//! | 36 | 1 | the listener's devices, 1..=8 (more than 1: a virtual device, `makeVDevice`; the connecting side sizes its CTS ring by it) |
//! | 120 | 8 | connect state id (0 as shipped by `listen`; see [`super::Connects`]) |

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::{Error, Stage};
use crate::comm::Class;
use crate::transport::Kind;

/// Bytes of NCCL's opaque handle (`NCCL_NET_HANDLE_MAXSIZE`).
pub const HANDLE_SIZE: usize = 128;
const HANDLE_MAGIC: &[u8; 8] = b"VNETHDL1";
/// Where the connect state id lives.
const STATE_OFF: usize = 120;

/// The decoded listen handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    /// Random nonce of the listen comm.
    pub nonce: u64,
    /// Transport the listener runs.
    pub kind: Kind,
    /// Where the listener accepts the out-of-band connection.
    pub addr: SocketAddr,
    /// The listener's devices (`1..=MAX_DEVS`): its buffers carry that many rkeys.
    pub devs: u8,
}

impl Handle {
    /// Serializes into the first 120 bytes of `b`; the state word is zeroed.
    pub fn write(&self, b: &mut [u8; HANDLE_SIZE]) {
        b.fill(0);
        b[0..8].copy_from_slice(HANDLE_MAGIC);
        b[8..16].copy_from_slice(&self.nonce.to_le_bytes());
        b[17] = match self.kind {
            Kind::Ib => 1,
            Kind::Tcp => 2,
        };
        b[18..20].copy_from_slice(&self.addr.port().to_le_bytes());
        b[36] = self.devs;
        match self.addr.ip() {
            IpAddr::V4(a) => {
                b[16] = 4;
                b[20..24].copy_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                b[16] = 6;
                b[20..36].copy_from_slice(&a.octets());
            }
        }
    }

    /// Parses a handle; errors name what is wrong with it.
    pub fn read(b: &[u8; HANDLE_SIZE]) -> Result<Handle, Error> {
        if &b[0..8] != HANDLE_MAGIC {
            return Err(Error::new(
                Stage::Handle,
                Class::InvalidArgument,
                "the connect handle was not made by verbsnet's listen (wrong magic): both ranks must \
                 use the same NCCL net plugin",
            ));
        }
        let kind = match b[17] {
            1 => Kind::Ib,
            2 => Kind::Tcp,
            k => {
                return Err(Error::new(
                    Stage::Handle,
                    Class::InvalidArgument,
                    format!("connect handle names unknown transport {k}"),
                ))
            }
        };
        let port = u16::from_le_bytes([b[18], b[19]]);
        let ip = match b[16] {
            4 => IpAddr::V4(Ipv4Addr::new(b[20], b[21], b[22], b[23])),
            6 => IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(&b[20..36]).expect("16 bytes"),
            )),
            f => {
                return Err(Error::new(
                    Stage::Handle,
                    Class::InvalidArgument,
                    format!("connect handle has address family {f}"),
                ))
            }
        };
        let devs = b[36];
        if devs == 0 || usize::from(devs) > crate::engine::wire::MAX_DEVS {
            return Err(Error::new(
                Stage::Handle,
                Class::InvalidArgument,
                format!(
                    "connect handle names {devs} listener devices (1..={}): made by another \
                     verbsnet version?",
                    crate::engine::wire::MAX_DEVS
                ),
            ));
        }
        Ok(Handle {
            nonce: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            kind,
            addr: SocketAddr::new(ip, port),
            devs,
        })
    }
}

/// The connect state id `handle` carries (0: none).
pub(super) fn state_id(handle: &[u8; HANDLE_SIZE]) -> u64 {
    u64::from_le_bytes(handle[STATE_OFF..].try_into().expect("8 bytes"))
}

/// Stores the connect state id `id` in `handle` (0 clears it: done or failed).
pub(super) fn set_state_id(handle: &mut [u8; HANDLE_SIZE], id: u64) {
    handle[STATE_OFF..].copy_from_slice(&id.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_round_trips_and_rejects_foreign_bytes() {
        let h = Handle {
            nonce: 0x1234_5678_9abc_def0,
            kind: Kind::Tcp,
            addr: "127.0.0.1:4567".parse().unwrap(),
            devs: 1,
        };
        let mut b = [0u8; HANDLE_SIZE];
        h.write(&mut b);
        assert_eq!(Handle::read(&b).unwrap(), h);
        let h6 = Handle {
            nonce: 1,
            kind: Kind::Ib,
            addr: "[::1]:99".parse().unwrap(),
            devs: 8,
        };
        h6.write(&mut b);
        assert_eq!(Handle::read(&b).unwrap(), h6);
        for bad in [0u8, 9] {
            let mut c = b;
            c[36] = bad;
            assert!(
                matches!(Handle::read(&c), Err(e) if e.to_string().contains(&format!("names {bad} listener devices"))),
                "{bad}"
            );
        }
        b[0] = b'X';
        assert!(
            matches!(Handle::read(&b), Err(e) if e.class() == Class::InvalidArgument && e.to_string().contains("same NCCL net plugin"))
        );
    }
}
