//! The transport choice, every port and GID, and the queue depths against device limits.

#[allow(unused_imports)]
use super::*;

/// Transport choice and why, from the configuration, the ib survey and the devices the
/// plugin reported.
pub fn transport_check(
    choice: Option<TransportChoice>,
    surveyed: &Result<Vec<DeviceSurvey>, nccl_net_verbsnet::transport::TransportError>,
    plugin_devs: &[String],
) -> Check {
    let usable: Vec<&PortSurvey> = surveyed
        .as_ref()
        .map(|d| {
            d.iter()
                .flat_map(|d| d.ports.iter())
                .filter(|p| p.usable.is_ok())
                .collect()
        })
        .unwrap_or_default();
    let nports: usize = surveyed
        .as_ref()
        .map(|d| d.iter().map(|d| d.ports.len()).sum())
        .unwrap_or(0);
    let verbs = match surveyed {
        Err(e) => format!("verbs unavailable ({e})"),
        Ok(_) if nports == 0 => "no verbs devices".to_string(),
        Ok(_) => format!(
            "{} of {nports} verbs port(s) usable{}",
            usable.len(),
            if usable.is_empty() {
                String::new()
            } else {
                format!(
                    " ({})",
                    usable
                        .iter()
                        .map(|p| p.label.as_str())
                        .collect::<Vec<_>>()
                        .join(" ")
                )
            }
        ),
    };
    let picked = if plugin_devs.is_empty() {
        "the plugin did not initialise".to_string()
    } else if plugin_devs.iter().all(|d| d.starts_with("tcp")) {
        format!("tcp ({})", plugin_devs.join(" "))
    } else {
        format!("ib ({})", plugin_devs.join(" "))
    };
    let expect = "ib where an RDMA port is usable; tcp only by choice or on hosts without RDMA";
    match choice {
        None => Check::new(
            "transport",
            Verdict::Fail,
            format!("unknown: the configuration is invalid; {verbs}"),
        )
        .expect(expect)
        .fix("fix the config line"),
        Some(TransportChoice::Tcp) => Check::new(
            "transport",
            if usable.is_empty() {
                Verdict::Ok
            } else {
                Verdict::Warn
            },
            format!("VERBSNET_TRANSPORT=tcp: {picked}; {verbs}"),
        )
        .expect(expect)
        .fix(if usable.is_empty() {
            ""
        } else {
            "unset VERBSNET_TRANSPORT (auto) to use the usable RDMA port(s): tcp is far slower"
        }),
        Some(TransportChoice::Ib) if usable.is_empty() => Check::new(
            "transport",
            Verdict::Fail,
            format!("VERBSNET_TRANSPORT=ib but {verbs}: plugin init fails"),
        )
        .expect(expect)
        .fix("make a port usable (see the port lines), or VERBSNET_TRANSPORT=tcp"),
        Some(TransportChoice::Ib) => Check::new(
            "transport",
            Verdict::Ok,
            format!("VERBSNET_TRANSPORT=ib: {picked}; {verbs}"),
        )
        .expect(expect),
        Some(TransportChoice::Auto) if usable.is_empty() && nports > 0 => Check::new(
            "transport",
            Verdict::Warn,
            format!("auto: {picked}, because {verbs}: RDMA devices exist but none is usable"),
        )
        .expect(expect)
        .fix(
            "see the port lines for why each port is skipped; VERBSNET_TRANSPORT=tcp silences this",
        ),
        Some(TransportChoice::Auto) if usable.is_empty() => Check::new(
            "transport",
            Verdict::Ok,
            format!("auto: {picked}, because {verbs}"),
        )
        .expect(expect),
        Some(TransportChoice::Auto) => Check::new(
            "transport",
            Verdict::Ok,
            format!("auto: {picked}, because {verbs}"),
        )
        .expect(expect),
    }
}

/// One line per port (state, link layer, MTU, speed, usable or why not), one per port for its
/// GID choice, and the configured depths/SGEs against the device's limits.
pub fn device_checks(d: &DeviceSurvey, cfg: Option<&Config>, cfg_used: &Config) -> Vec<Check> {
    let mut out = Vec::new();
    if let Some(e) = &d.error {
        out.push(
            Check::new(format!("device {}", d.name), Verdict::Warn, e.clone())
                .expect("the device opens")
                .fix("check the driver (dmesg, `ibv_devinfo`) and permissions on /dev/infiniband"),
        );
        return out;
    }
    for p in &d.ports {
        let mtu = p.active_mtu.map_or("?".into(), |m| m.to_string());
        let speed = p.speed_mbps.map_or("unknown speed".into(), |s| {
            format!("{} Gbps", f64::from(s) / 1000.0)
        });
        let facts = format!(
            "{}, {}, active MTU {mtu} (max {}), {speed}",
            p.state,
            p.link_layer,
            p.max_mtu.map_or("?".into(), |m| m.to_string())
        );
        let forced = cfg_used.ib_gid_index.is_some();
        let (verdict, observed, fix) = match &p.usable {
            Ok(()) => (Verdict::Ok, format!("{facts}: used"), String::new()),
            Err(why) if why.contains("VERBSNET_IB_HCA") => {
                (Verdict::Ok, format!("{facts}: {why}"), String::new())
            }
            Err(why) if p.state == "ACTIVE" && (forced || why.contains("GID")) => (
                Verdict::Fail,
                format!("{facts}: skipped: {why}"),
                if forced {
                    "unset VERBSNET_IB_GID_INDEX (automatic choice), or set it to the index the \
                     gid line names"
                        .to_string()
                } else {
                    "give the port's netdev an IPv4 address (ip addr add ...), or set \
                     VERBSNET_IB_GID_INDEX"
                        .to_string()
                },
            ),
            Err(why) => (
                Verdict::Warn,
                format!("{facts}: skipped: {why}"),
                "bring the port up (ibv_devinfo; the netdev for RoCE), or exclude it with \
                 VERBSNET_IB_HCA=^<dev>:<port>"
                    .to_string(),
            ),
        };
        out.push(
            Check::new(format!("port {}", p.label), verdict, observed)
                .expect("ACTIVE, with a routable GID")
                .fix(fix),
        );
        out.push(gid_check(p, forced));
    }
    if let (Some(l), Some(cfg)) = (&d.limits, cfg) {
        out.extend(limit_checks(&d.name, l, cfg));
    }
    out
}

pub(super) fn gid_check(p: &PortSurvey, forced: bool) -> Check {
    let name = format!("gid {}", p.label);
    let skipped: Vec<String> = p
        .gids
        .iter()
        .filter(|(e, _)| {
            p.gid
                .as_ref()
                .map_or(true, |g| u32::from(g.index) != e.index)
        })
        .filter_map(|(e, why)| {
            why.as_ref()
                .map(|w| format!("[{}] {} {w}", e.index, e.addr()))
        })
        .collect();
    let others = if skipped.is_empty() {
        String::new()
    } else {
        format!("; others: {}", skipped.join("; "))
    };
    let expect = "a RoCE v2 GID with an IPv4 (or global IPv6) address; GID 0 on InfiniBand";
    match &p.gid {
        Ok(g) => {
            let kind = match g.kind {
                nccl_net_verbsnet::transport::ib::gid::GidKind::RoceV2 => "RoCE v2",
                nccl_net_verbsnet::transport::ib::gid::GidKind::RoceV1 => "RoCE v1",
                nccl_net_verbsnet::transport::ib::gid::GidKind::Unknown
                    if p.link_layer == "InfiniBand" =>
                {
                    "IB"
                }
                nccl_net_verbsnet::transport::ib::gid::GidKind::Unknown => "type unknown",
            };
            let c = Check::new(
                name,
                if g.caveat.is_some() {
                    Verdict::Warn
                } else {
                    Verdict::Ok
                },
                format!("index {} {} {kind} ({}){others}", g.index, g.addr, g.why),
            )
            .expect(expect);
            match &g.caveat {
                Some(cv) => c.fix(format!(
                    "{cv}: unset VERBSNET_IB_GID_INDEX unless the fabric routes it"
                )),
                None => c,
            }
        }
        Err(why) => Check::new(
            name,
            if p.state == "ACTIVE" {
                Verdict::Fail
            } else {
                Verdict::Warn
            },
            format!("none: {why}{others}"),
        )
        .expect(expect)
        .fix(if forced {
            "unset VERBSNET_IB_GID_INDEX or pick an index listed here"
        } else {
            "give the netdev an IP address, or set VERBSNET_IB_GID_INDEX"
        }),
    }
}

/// The QP and CQ depths and SGEs that `conn::qp_config` asks for under `cfg`, against the
/// device's limits (the ib transport clamps depths to the limits with a WARN, which leaves the
/// engine posting more WRs than the queue holds).
pub fn limit_checks(
    dev: &str,
    l: &nccl_net_verbsnet::transport::ib::survey::DeviceLimits,
    cfg: &Config,
) -> Vec<Check> {
    let q = nccl_net_verbsnet::conn::qp_config(cfg);
    let cqe = u64::from(q.max_send_wr) + u64::from(q.max_recv_wr);
    let mut out = Vec::new();
    let rq = Check::new(
        format!("depth.rq {dev}"),
        if q.max_recv_wr <= l.max_qp_wr {
            Verdict::Ok
        } else {
            Verdict::Fail
        },
        format!("VERBSNET_RQ_DEPTH={} receive WRs per QP", q.max_recv_wr),
    )
    .expect(format!("<= max_qp_wr {}", l.max_qp_wr));
    out.push(if q.max_recv_wr > l.max_qp_wr {
        rq.fix(format!(
            "set VERBSNET_RQ_DEPTH <= {} (the RQ would be clamped below the depth verbsnet posts: \
             post_recv fails)",
            l.max_qp_wr
        ))
    } else {
        rq
    });
    let sq = Check::new(
        format!("depth.sq {dev}"),
        if q.max_send_wr <= l.max_qp_wr { Verdict::Ok } else { Verdict::Fail },
        format!(
            "{} send WRs per QP (2 x {MAX_SEND_REQUESTS} request slots + {CTRL_STAGE_SLOTS} control)",
            q.max_send_wr
        ),
    )
    .expect(format!("<= max_qp_wr {}", l.max_qp_wr));
    out.push(if q.max_send_wr > l.max_qp_wr {
        sq.fix("this device's send queue is too small for verbsnet; use another device (VERBSNET_IB_HCA)")
    } else {
        sq
    });
    let cq = Check::new(
        format!("depth.cq {dev}"),
        if cqe <= u64::from(l.max_cqe) {
            Verdict::Ok
        } else {
            Verdict::Fail
        },
        format!("{cqe} CQ entries per QP (send + receive WRs)"),
    )
    .expect(format!("<= max_cqe {}", l.max_cqe));
    out.push(if cqe > u64::from(l.max_cqe) {
        cq.fix(format!(
            "set VERBSNET_RQ_DEPTH <= {} (a clamped CQ can overrun: the QP then fails)",
            u64::from(l.max_cqe).saturating_sub(u64::from(q.max_send_wr))
        ))
    } else {
        cq
    });
    let sge = Check::new(
        format!("sge {dev}"),
        if MAX_SEND_SGE as u32 <= l.max_sge {
            Verdict::Ok
        } else {
            Verdict::Fail
        },
        format!("{MAX_SEND_SGE} SGEs per send WR, 1 per receive WR; inline data: none"),
    )
    .expect(format!("<= max_sge {}", l.max_sge));
    out.push(if MAX_SEND_SGE as u32 > l.max_sge {
        sge.fix(
            "this device cannot carry verbsnet's eager SEND (header + payload); use another device",
        )
    } else {
        sge
    });
    out
}
