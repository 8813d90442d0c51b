//! `--vdevice LIST`: NIC fusion, asked of the plugin as NCCL's topology code asks for it
//! (`src/graph/topo.cc`: `ncclTopoProcessNet`, `ncclTopoMakeVNics`, `ncclTopoMakeVnic`).
//!
//! NCCL, once per process and plugin, after `init` and the physical devices' `getProperties`:
//! calls `makeVDevice(&d, {ndevs, devs})` for each group of 2 or more physical devices it fuses
//! (never for a group of 1), then `devices()` again (the virtual devices are the ones counted
//! after the physical ones) and `getProperties` of each new device, whose `vProps` lists the
//! physical devices; from then on the new index is a device like any other for `listen` and
//! `connect`. A NULL `makeVDevice` means no fusion (physical devices only); a failing one makes
//! NCCL's automatic fusion keep those devices apart, and fails `NCCL_NET_FORCE_MERGE`.
//!
//! [`make`] does the same for the one group `--vdevice` names and checks what the plugin
//! reports after it: a count that did not grow by one, an index other than the last, or
//! `vProps` other than the group are contract deviations ([`crate::deviations`]), reported,
//! not failed; the run uses the index `makeVDevice` returned.

use serde_json::{json, Value};

use crate::deviations;
use crate::plugin::{Net, VDeviceSlot, VProps};

/// The virtual device a rank made and runs on.
#[derive(Clone, Debug)]
pub struct VDevice {
    /// The index `makeVDevice` wrote (the device of every `listen`/`connect`).
    pub index: i32,
    /// Its `getProperties` name (NCCL's IB transport joins the physical names with `+`).
    pub name: String,
    /// The physical devices asked for, in `--vdevice` order.
    pub requested: Vec<i32>,
    /// The names of the requested physical devices, in the same order.
    pub physical: Vec<String>,
    /// Its `vProps`, as `getProperties` reported them (`None`: the table has none).
    pub vprops: Option<VProps>,
    /// `devices()` before `makeVDevice` (the physical devices).
    pub devices_before: i32,
    /// `devices()` after it.
    pub devices_after: i32,
}

impl VDevice {
    /// The header line, nccl-tests style:
    /// `#  Using virtual device [2] tcp0+tcp1 (vProps 0,1) made by makeVDevice`.
    pub fn line(&self) -> String {
        format!(
            "#  Using virtual device [{}] {} (vProps {}) made by makeVDevice",
            self.index,
            self.name,
            self.vprops
                .as_ref()
                .map_or_else(|| "?".into(), |v| join(&v.devs)),
        )
    }

    /// `--json`'s `device.vdevice` object.
    pub fn to_json(&self) -> Value {
        json!({
            "index": self.index,
            "name": self.name,
            "requested": self.requested,
            "physical": self.physical,
            "vprops": self.vprops.as_ref().map(|v| &v.devs),
            "vprops_ndevs": self.vprops.as_ref().map(|v| v.ndevs),
            "devices_before": self.devices_before,
            "devices_after": self.devices_after,
            "made_by": "makeVDevice",
            "line": self.line(),
        })
    }
}

fn join(devs: &[i32]) -> String {
    devs.iter()
        .map(i32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Fuses `devs` (2 or more distinct indices, as `--vdevice` parsed them) of the `ndev`
/// physical devices `devices()` reported, as NCCL does (see the module docs), and records the
/// deviations [`check`] finds.
///
/// # Errors
/// A message for the user: a table without `makeVDevice` (v6-v8) or with a NULL one, more
/// devices than the version fuses, an index that is not a physical device, a failing
/// `makeVDevice` (with its `ncclResult_t`), or a failing `devices`/`getProperties`.
pub fn make(net: &Net, devs: &[i32], ndev: i32) -> Result<VDevice, String> {
    let plugin = format!("{} {}", net.name(), net.symbol());
    let list = join(devs);
    match net.vdevice_slot().map_err(|e| e.to_string())? {
        VDeviceSlot::Absent => {
            return Err(format!(
                "{plugin} has no makeVDevice: NIC fusion needs v9+; drop --vdevice"
            ))
        }
        VDeviceSlot::Null => {
            return Err(format!(
                "{plugin} has a NULL makeVDevice: NCCL then uses the physical devices only, no \
                 NIC fusion (src/graph/topo.cc: ncclTopoProcessNet); drop --vdevice"
            ))
        }
        VDeviceSlot::Set { max_devs } if devs.len() > max_devs => {
            return Err(format!(
                "--vdevice {list}: {plugin} fuses at most {max_devs} devices per virtual device \
                 (NCCL's maxDevsPerNic: 4 for ncclNet v9-v11, 8 for v12)"
            ))
        }
        VDeviceSlot::Set { .. } => {}
    }
    if let Some(d) = devs.iter().find(|&&d| d < 0 || d >= ndev) {
        return Err(format!(
            "--vdevice {list}: device {d} is not a physical device of {plugin}, which reports \
             {ndev} (0..={})",
            ndev - 1
        ));
    }
    // NCCL reads every physical device's properties before it fuses any
    // (src/graph/topo.cc: ncclTopoPopulateNics, ncclTopoMakeVNics).
    let mut names = Vec::with_capacity(ndev as usize);
    for d in 0..ndev {
        let p = net
            .properties(d)
            .map_err(|e| format!("getProperties({d}) before makeVDevice: {e}"))?;
        names.push(p.name);
    }
    let index = net.make_vdevice(devs).map_err(|e| {
        format!(
            "makeVDevice of devices {list} failed: {e}. NCCL's automatic fusion would keep \
             these devices apart, NCCL_NET_FORCE_MERGE would fail (src/graph/topo.cc: \
             ncclTopoMakeVnic); the plugin's log may say why (NCCL_DEBUG=INFO \
             NCCL_DEBUG_SUBSYS=NET)"
        )
    })?;
    let after = net
        .devices()
        .map_err(|e| format!("devices after makeVDevice: {e}"))?;
    let props = net.properties(index).map_err(|e| {
        format!("getProperties({index}) of the device makeVDevice of {list} returned: {e}")
    })?;
    for (kind, detail) in check(ndev, after, index, devs, props.vprops.as_ref()) {
        deviations::note(kind, || detail);
    }
    Ok(VDevice {
        index,
        name: props.name,
        requested: devs.to_vec(),
        physical: devs.iter().map(|&d| names[d as usize].clone()).collect(),
        vprops: props.vprops,
        devices_before: ndev,
        devices_after: after,
    })
}

/// What the plugin reported after `makeVDevice` of `devs` against the contract NCCL's
/// topology code assumes: `devices()` grew from `before` to `before + 1`, the index written is
/// the last device, and `getProperties(index).vProps` lists exactly `devs`. Returns the
/// deviations ([`deviations::VDEV_COUNT`], [`deviations::VDEV_INDEX`],
/// [`deviations::VDEV_PROPS`]) with a description each.
pub fn check(
    before: i32,
    after: i32,
    index: i32,
    devs: &[i32],
    vprops: Option<&VProps>,
) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if after != before + 1 {
        out.push((
            deviations::VDEV_COUNT,
            format!(
                "devices reported {before} before makeVDevice of {} and {after} after it",
                join(devs)
            ),
        ));
    }
    if index != after - 1 {
        out.push((
            deviations::VDEV_INDEX,
            format!(
                "makeVDevice of {} returned device {index}; devices now reports {after}, so \
                 the new one is {}",
                join(devs),
                after - 1
            ),
        ));
    }
    let listed =
        vprops.is_some_and(|v| usize::try_from(v.ndevs) == Ok(devs.len()) && v.devs == devs);
    if !listed {
        out.push((
            deviations::VDEV_PROPS,
            match vprops {
                Some(v) => format!(
                    "getProperties({index}).vProps is {{ndevs={}, devs=[{}]}}; makeVDevice was \
                     given {}",
                    v.ndevs,
                    join(&v.devs),
                    join(devs)
                ),
                None => format!("getProperties({index}) has no vProps"),
            },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vp(ndevs: i32, devs: &[i32]) -> VProps {
        VProps {
            ndevs,
            devs: devs.to_vec(),
        }
    }

    #[test]
    fn a_plugin_doing_what_nccl_assumes_has_no_deviation() {
        assert!(check(2, 3, 2, &[0, 1], Some(&vp(2, &[0, 1]))).is_empty());
        assert!(check(4, 5, 4, &[3, 1, 2], Some(&vp(3, &[3, 1, 2]))).is_empty());
    }

    #[test]
    fn each_broken_promise_is_its_own_deviation() {
        let kinds =
            |v: Vec<(&'static str, String)>| v.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        // Count unchanged, and the index is then not the last one either.
        let d = check(2, 2, 2, &[0, 1], Some(&vp(2, &[0, 1])));
        assert_eq!(
            kinds(d.clone()),
            [deviations::VDEV_COUNT, deviations::VDEV_INDEX]
        );
        assert!(
            d[0].1
                .contains("reported 2 before makeVDevice of 0,1 and 2 after"),
            "{}",
            d[0].1
        );
        // Grew, but the index written is a physical device's.
        let d = check(2, 3, 0, &[0, 1], Some(&vp(2, &[0, 1])));
        assert_eq!(kinds(d.clone()), [deviations::VDEV_INDEX]);
        assert!(d[0]
            .1
            .contains("returned device 0; devices now reports 3, so the new one is 2"));
        // vProps: another order, a short count with the right first entries, none at all.
        for (v, text) in [
            (Some(vp(2, &[1, 0])), "{ndevs=2, devs=[1,0]}"),
            (Some(vp(1, &[0])), "{ndevs=1, devs=[0]}"),
            (Some(vp(3, &[0, 1, 0])), "{ndevs=3, devs=[0,1,0]}"),
            (None, "has no vProps"),
        ] {
            let d = check(2, 3, 2, &[0, 1], v.as_ref());
            assert_eq!(kinds(d.clone()), [deviations::VDEV_PROPS]);
            assert!(d[0].1.contains(text), "{}", d[0].1);
        }
        // A clamped array whose ndevs says more than it holds is still wrong.
        let d = check(2, 3, 2, &[0, 1], Some(&vp(9, &[0, 1])));
        assert_eq!(kinds(d), [deviations::VDEV_PROPS]);
    }

    #[test]
    fn the_line_names_the_device_and_its_vprops() {
        let v = VDevice {
            index: 2,
            name: "tcp0+tcp1".into(),
            requested: vec![0, 1],
            physical: vec!["tcp0".into(), "tcp1".into()],
            vprops: Some(vp(2, &[0, 1])),
            devices_before: 2,
            devices_after: 3,
        };
        assert_eq!(
            v.line(),
            "#  Using virtual device [2] tcp0+tcp1 (vProps 0,1) made by makeVDevice"
        );
        let j = v.to_json();
        assert_eq!(
            (&j["index"], &j["name"], &j["vprops"], &j["physical"]),
            (
                &json!(2),
                &json!("tcp0+tcp1"),
                &json!([0, 1]),
                &json!(["tcp0", "tcp1"])
            )
        );
    }
}
