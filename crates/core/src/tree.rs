//! The process tree of one /proc scan: children, descendants and ancestors,
//! for selection, reports, bundles and containment alike.
//!
//! A tree read from /proc is not always a tree: PIDs are reused while the
//! scan runs, so a parent link can point at a process that started after its
//! "child" (the real parent exited and its PID went to a stranger), and a
//! loop is possible in principle. A link counts only when the parent started
//! no later than the child, and every walk stops at its first repeat.

use std::collections::{BTreeSet, HashMap};

use crate::proc::{ProcessId, ProcessRecord};

#[derive(Debug, Default, Clone)]
pub struct ProcessTree {
    children: HashMap<u32, Vec<u32>>,
    parents: HashMap<u32, u32>,
}

impl ProcessTree {
    /// The tree of these processes.
    pub fn new<'a>(records: impl IntoIterator<Item = &'a ProcessRecord>) -> ProcessTree {
        ProcessTree::from_links(records.into_iter().map(|record| (record.id, record.ppid)))
    }

    /// The tree of (process, parent PID) links, where the parent's start
    /// time is known from the same list.
    pub(crate) fn from_links(links: impl IntoIterator<Item = (ProcessId, u32)>) -> ProcessTree {
        let links: Vec<(ProcessId, u32)> = links.into_iter().collect();
        let started: HashMap<u32, u64> = links
            .iter()
            .map(|(id, _)| (id.pid, id.start_time))
            .collect();
        let mut tree = ProcessTree::default();
        for (id, ppid) in links {
            let parent_is_older = started
                .get(&ppid)
                .is_some_and(|&parent_start| parent_start <= id.start_time);
            if ppid == 0 || ppid == id.pid || !parent_is_older {
                continue;
            }
            tree.children.entry(ppid).or_default().push(id.pid);
            tree.parents.insert(id.pid, ppid);
        }
        for children in tree.children.values_mut() {
            children.sort_unstable();
        }
        tree
    }

    /// Direct children of `pid`, in PID order.
    pub fn children(&self, pid: u32) -> &[u32] {
        self.children.get(&pid).map_or(&[], Vec::as_slice)
    }

    /// The parent of `pid`, if it is in the tree.
    pub fn parent(&self, pid: u32) -> Option<u32> {
        self.parents.get(&pid).copied()
    }

    /// Every descendant of `root`, not including it.
    pub fn descendants(&self, root: u32) -> Vec<u32> {
        let mut found = Vec::new();
        let mut seen = BTreeSet::from([root]);
        let mut stack = vec![root];
        while let Some(pid) = stack.pop() {
            for &child in self.children(pid) {
                if seen.insert(child) {
                    found.push(child);
                    stack.push(child);
                }
            }
        }
        found
    }

    /// The parents of `pid` in the tree, nearest first.
    pub fn ancestors(&self, pid: u32) -> Vec<u32> {
        let mut chain = Vec::new();
        let mut seen = BTreeSet::from([pid]);
        let mut current = pid;
        while let Some(parent) = self.parent(current) {
            if !seen.insert(parent) {
                break;
            }
            chain.push(parent);
            current = parent;
        }
        chain
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(pid: u32, start_time: u64) -> ProcessId {
        ProcessId { pid, start_time }
    }

    #[test]
    fn walks_down_and_up() {
        let tree = ProcessTree::from_links([
            (id(1, 0), 0),
            (id(10, 5), 1),
            (id(11, 6), 10),
            (id(12, 7), 10),
            (id(13, 8), 12),
        ]);
        assert_eq!(tree.children(10), [11, 12]);
        let mut below: Vec<u32> = tree.descendants(10);
        below.sort_unstable();
        assert_eq!(below, [11, 12, 13]);
        assert_eq!(tree.ancestors(13), [12, 10, 1]);
        assert_eq!(tree.ancestors(1), Vec::<u32>::new());
    }

    /// PID reuse during a scan: the "parent" started after the child, so it
    /// is a stranger that took the dead parent's PID.
    #[test]
    fn a_parent_younger_than_its_child_is_no_parent() {
        let tree = ProcessTree::from_links([(id(1, 0), 0), (id(20, 100), 1), (id(30, 50), 20)]);
        assert!(tree.children(20).is_empty());
        assert_eq!(tree.parent(30), None);
        assert_eq!(tree.descendants(1), [20]);
    }

    #[test]
    fn loops_end() {
        // Equal start times: each is "no younger" than the other.
        let tree = ProcessTree::from_links([(id(40, 9), 41), (id(41, 9), 40)]);
        assert_eq!(tree.ancestors(40), [41]);
        assert_eq!(tree.descendants(40), [41]);
    }
}
