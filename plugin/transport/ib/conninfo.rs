//! What a peer needs to connect to one of our RC QPs (the `local_info` bytes exchanged on the
//! set-up socket): layout, encoding and the checks on what a peer sends.

use super::context::{LINK_LAYER_ETHERNET, LINK_LAYER_INFINIBAND};
use super::convert;
use crate::transport::TransportError;

/// What a peer needs to connect to one of our QPs: the bytes of [`QueuePair::local_info`].
///
/// Wire layout, 32 bytes, integers little-endian:
///
/// ```text
///  0  u8   version (1)
///  1  u8   link layer (1 = InfiniBand, 2 = Ethernet/RoCE)
///  2  u8   active MTU of the port (ibv_mtu code: 1 = 256 ... 5 = 4096)
///  3  u8   port number (informational)
///  4  u32  QP number
///  8  u32  initial packet sequence number (24 bits)
/// 12  u16  LID (InfiniBand; 0 on RoCE)
/// 14  u16  reserved, 0
/// 16  [16] GID, network byte order
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnInfo {
    /// `LINK_LAYER_INFINIBAND` or `LINK_LAYER_ETHERNET`.
    pub link_layer: u8,
    /// Active MTU (`ibv_mtu` code).
    pub mtu: u8,
    /// Port number.
    pub port: u8,
    /// QP number.
    pub qpn: u32,
    /// Initial PSN.
    pub psn: u32,
    /// LID.
    pub lid: u16,
    /// GID (network order).
    pub gid: [u8; 16],
}

impl ConnInfo {
    /// Encoded size.
    pub const LEN: usize = 32;
    const VERSION: u8 = 1;

    /// The wire bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(Self::LEN);
        b.extend_from_slice(&[Self::VERSION, self.link_layer, self.mtu, self.port]);
        b.extend_from_slice(&self.qpn.to_le_bytes());
        b.extend_from_slice(&self.psn.to_le_bytes());
        b.extend_from_slice(&self.lid.to_le_bytes());
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&self.gid);
        b
    }

    /// Parses the wire bytes.
    ///
    /// # Errors
    /// [`TransportError::Protocol`] for a wrong length, version, link layer or MTU code.
    pub fn decode(b: &[u8]) -> Result<ConnInfo, TransportError> {
        if b.len() != Self::LEN {
            return Err(TransportError::Protocol(format!(
                "ib connection info is {} bytes, expected {} (is the peer running the tcp \
                 transport or another verbsnet version?)",
                b.len(),
                Self::LEN
            )));
        }
        if b[0] != Self::VERSION {
            return Err(TransportError::Protocol(format!(
                "ib connection info version {}, expected {}",
                b[0],
                Self::VERSION
            )));
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let info = ConnInfo {
            link_layer: b[1],
            mtu: b[2],
            port: b[3],
            qpn: u32_at(4),
            psn: u32_at(8) & 0xff_ffff,
            lid: u16::from_le_bytes([b[12], b[13]]),
            gid: b[16..32]
                .try_into()
                .expect("16-byte slice of a 32-byte buffer"),
        };
        if info.link_layer != LINK_LAYER_ETHERNET && info.link_layer != LINK_LAYER_INFINIBAND {
            return Err(TransportError::Protocol(format!(
                "peer link layer {} is neither InfiniBand (1) nor Ethernet (2)",
                info.link_layer
            )));
        }
        if convert::mtu_bytes(u32::from(info.mtu)).is_none() {
            return Err(TransportError::Protocol(format!(
                "peer MTU code {} is not an ibv_mtu",
                info.mtu
            )));
        }
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_info_round_trips() {
        let info = ConnInfo {
            link_layer: LINK_LAYER_ETHERNET,
            mtu: 5,
            port: 1,
            qpn: 0x11,
            psn: 0xabcdef,
            lid: 0,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1],
        };
        let b = info.encode();
        assert_eq!(b.len(), ConnInfo::LEN);
        assert_eq!(ConnInfo::decode(&b).unwrap(), info);
    }

    #[test]
    fn conn_info_rejects_garbage() {
        let good = ConnInfo {
            link_layer: LINK_LAYER_INFINIBAND,
            mtu: 3,
            port: 1,
            qpn: 7,
            psn: 1,
            lid: 9,
            gid: [0; 16],
        }
        .encode();
        assert!(ConnInfo::decode(&good[..31]).is_err());
        let mut v = good.clone();
        v[0] = 2;
        assert!(ConnInfo::decode(&v).is_err());
        let mut v = good.clone();
        v[1] = 3;
        assert!(ConnInfo::decode(&v).is_err());
        let mut v = good;
        v[2] = 6;
        assert!(ConnInfo::decode(&v).is_err());
    }
}
