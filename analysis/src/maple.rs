//! The entries of a Linux maple tree (lib/maple_tree.c), read from outside
//! the guest: a process's memory map keeps its VMAs in one. Only what a
//! reader at a stop needs: every entry, in index order, found by walking
//! the nodes from the root within each node's used slots.

use provm_vmm::paging::Unmapped;
use serde::Deserialize;

/// The tree's layout, from the kernel profile.
#[derive(Clone, Debug, Deserialize)]
pub struct MapleOffsets {
    pub maple_tree_ma_root: u64,
    pub maple_node_mask: u64,
    pub maple_node_type_shift: u64,
    pub maple_node_type_mask: u64,
    pub maple_leaf_64: u64,
    pub maple_range_64: u64,
    pub maple_arange_64: u64,
    pub maple_range64_slots: u64,
    pub maple_arange64_slots: u64,
    pub maple_range_64_pivot: u64,
    pub maple_range_64_slot: u64,
    pub maple_range_64_meta: u64,
    pub maple_arange_64_pivot: u64,
    pub maple_arange_64_slot: u64,
    pub maple_arange_64_meta: u64,
    pub maple_metadata_end: u64,
}

/// The deepest tree walked (`MAPLE_HEIGHT_MAX`).
const MAX_HEIGHT: u32 = 31;
/// Entries below this with the node bits are reserved values, not nodes.
const RESERVED_RANGE: u64 = 4096;

/// Where a node type keeps its pivots, slots and metadata.
struct Layout {
    pivot: u64,
    slot: u64,
    meta: u64,
    slots: u64,
    /// Whether the node's used-slot count is always in its metadata.
    meta_always: bool,
}

/// Reads a maple tree's entries with `read_u64` (kernel addresses).
pub struct MapleTree<'a, R> {
    offsets: &'a MapleOffsets,
    read_u64: R,
}

impl<'a, R: Fn(u64) -> Result<u64, Unmapped>> MapleTree<'a, R> {
    pub fn new(offsets: &'a MapleOffsets, read_u64: R) -> Self {
        MapleTree { offsets, read_u64 }
    }

    /// Every entry of the tree at `tree` (a `struct maple_tree`), in order.
    pub fn entries(&self, tree: u64) -> Result<Vec<u64>, Unmapped> {
        let root = (self.read_u64)(tree + self.offsets.maple_tree_ma_root)?;
        let mut out = Vec::new();
        if is_node(root) {
            self.walk(root, u64::MAX, 0, &mut out)?;
        } else if root != 0 {
            // A tree of one entry, at index 0, keeps it in its root.
            out.push(root);
        }
        Ok(out)
    }

    fn layout(&self, node_type: u64) -> Option<Layout> {
        let o = self.offsets;
        if node_type == o.maple_arange_64 {
            Some(Layout {
                pivot: o.maple_arange_64_pivot,
                slot: o.maple_arange_64_slot,
                meta: o.maple_arange_64_meta,
                slots: o.maple_arange64_slots,
                meta_always: true,
            })
        } else if node_type == o.maple_range_64 || node_type == o.maple_leaf_64 {
            Some(Layout {
                pivot: o.maple_range_64_pivot,
                slot: o.maple_range_64_slot,
                meta: o.maple_range_64_meta,
                slots: o.maple_range64_slots,
                meta_always: false,
            })
        } else {
            // Dense nodes: no tree of VMAs has them.
            None
        }
    }

    /// Collects the entries under the encoded node `node`, whose indices
    /// end at `max`.
    fn walk(&self, node: u64, max: u64, depth: u32, out: &mut Vec<u64>) -> Result<(), Unmapped> {
        let o = self.offsets;
        let node_type = (node >> o.maple_node_type_shift) & o.maple_node_type_mask;
        let Some(layout) = self.layout(node_type) else {
            return Ok(());
        };
        if depth > MAX_HEIGHT {
            return Ok(());
        }
        let base = node & !o.maple_node_mask;
        let pivot = |index: u64| (self.read_u64)(base + layout.pivot + 8 * index);
        let end = self.data_end(base, &layout, max, &pivot)?;
        for index in 0..=end {
            let entry = (self.read_u64)(base + layout.slot + 8 * index)?;
            if entry == 0 {
                continue;
            }
            if node_type == o.maple_leaf_64 {
                out.push(entry);
            } else {
                let last = if index < layout.slots - 1 {
                    pivot(index)?
                } else {
                    max
                };
                self.walk(entry, last, depth + 1, out)?;
            }
        }
        Ok(())
    }

    /// The last used slot of a node (`ma_data_end`): a full node's last
    /// pivot is its maximum or is not kept; otherwise its metadata says.
    fn data_end(
        &self,
        base: u64,
        layout: &Layout,
        max: u64,
        pivot: &impl Fn(u64) -> Result<u64, Unmapped>,
    ) -> Result<u64, Unmapped> {
        let last_pivot = layout.slots - 2;
        if !layout.meta_always {
            match pivot(last_pivot)? {
                0 => {}
                value if value == max => return Ok(last_pivot),
                _ => return Ok(layout.slots - 1),
            }
        }
        let meta = (self.read_u64)(base + layout.meta + self.offsets.maple_metadata_end)?;
        Ok((meta & 0xff).min(layout.slots - 1))
    }
}

/// Whether a tree entry is an encoded node (`xa_is_node`).
fn is_node(entry: u64) -> bool {
    entry & 3 == 2 && entry > RESERVED_RANGE
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The layout of Linux 6.1 on x86-64.
    fn offsets() -> MapleOffsets {
        MapleOffsets {
            maple_tree_ma_root: 8,
            maple_node_mask: 255,
            maple_node_type_shift: 3,
            maple_node_type_mask: 15,
            maple_leaf_64: 1,
            maple_range_64: 2,
            maple_arange_64: 3,
            maple_range64_slots: 16,
            maple_arange64_slots: 10,
            maple_range_64_pivot: 8,
            maple_range_64_slot: 128,
            maple_range_64_meta: 248,
            maple_arange_64_pivot: 8,
            maple_arange_64_slot: 80,
            maple_arange_64_meta: 240,
            maple_metadata_end: 0,
        }
    }

    /// A node of `node_type` at `base` with these pivots, slots and end.
    fn node(
        memory: &mut HashMap<u64, u64>,
        base: u64,
        layout: (u64, u64, u64),
        pivots: &[u64],
        slots: &[u64],
        end: u64,
    ) {
        let (pivot, slot, meta) = layout;
        for (index, value) in pivots.iter().enumerate() {
            memory.insert(base + pivot + 8 * index as u64, *value);
        }
        for (index, value) in slots.iter().enumerate() {
            memory.insert(base + slot + 8 * index as u64, *value);
        }
        memory.insert(base + meta, end);
    }

    #[test]
    fn entries_come_from_every_leaf_within_each_nodes_used_slots() {
        let offsets = offsets();
        let mut memory = HashMap::new();
        memory.insert(0x100 + 8, 0x1000 | (3 << 3) | 2);
        // The root (arange_64): two leaves; a stale third slot past its end.
        node(
            &mut memory,
            0x1000,
            (8, 80, 240),
            &[0x5fff, u64::MAX],
            &[
                0x2000 | (1 << 3) | 2,
                0x3000 | (1 << 3) | 2,
                0x4000 | (1 << 3) | 2,
            ],
            1,
        );
        node(
            &mut memory,
            0x2000,
            (8, 128, 248),
            &[0xfff, 0x5fff],
            &[0, 0xa0],
            1,
        );
        node(
            &mut memory,
            0x3000,
            (8, 128, 248),
            &[0x7fff],
            &[0xb0, 0xc0],
            1,
        );
        node(&mut memory, 0x4000, (8, 128, 248), &[0x9fff], &[0xd0], 0);
        let read = |address: u64| Ok(memory.get(&address).copied().unwrap_or(0));
        let tree = MapleTree::new(&offsets, read);
        assert_eq!(tree.entries(0x100).unwrap(), vec![0xa0, 0xb0, 0xc0]);
    }

    #[test]
    fn a_tree_of_one_entry_keeps_it_in_its_root() {
        let offsets = offsets();
        let read = |address: u64| Ok(if address == 0x108 { 0xa0 } else { 0 });
        assert_eq!(
            MapleTree::new(&offsets, read).entries(0x100).unwrap(),
            vec![0xa0]
        );
    }
}
