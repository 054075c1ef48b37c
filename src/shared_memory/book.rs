//! Who holds what: the exporter's names, and the leases its importers hold on them. Pure
//! bookkeeping (no I/O, no memory), what the lifetime model checks.
//!
//! Invariants (checked by `tests::lifetimes` against a model):
//! 1. A name resolves only while it is exported; a resolve takes a lease for that importer.
//! 2. A buffer withdrawn (its block freed by the exporter) while leased is kept, out of the
//!    names, until its last lease goes: by a release, or when its importer's connection closes
//!    (it exited or died). Only then is its free reported, once ([`Book::release`],
//!    [`Book::drop_importer`]).
//! 3. A name exported again after a withdrawal is another buffer: leases on the old one hold
//!    the old one only.

use super::error::ShareError;
use super::message::BufferSpec;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// An importer's connection, numbered by its exporter.
pub type ImporterId = u64;
/// One export of a buffer under a name (a name exported again is a new buffer).
pub type BufferId = u64;

#[derive(Debug)]
struct Buffer {
    name: String,
    spec: BufferSpec,
    holders: BTreeSet<ImporterId>,
    withdrawn: bool,
}

/// What a withdrawal did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Withdrawal {
    /// No importer held it: its block may be freed now.
    Free,
    /// Importers hold it: its free waits for the last of them.
    Deferred {
        /// How many importers hold it.
        holders: usize,
    },
}

/// The book's own figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BookFigures {
    /// Names exported now.
    pub names: u64,
    /// Leases held now (an importer's lease on one buffer counts once).
    pub leases: u64,
    /// Frees waiting for importers now.
    pub deferred_frees: u64,
    /// Frees that ever had to wait.
    pub deferred_total: u64,
    /// Frees done once their last importer let go (or died).
    pub frees_after_wait: u64,
}

/// The names and leases of one exporter.
#[derive(Debug, Default)]
pub struct Book {
    names: BTreeMap<String, BufferId>,
    buffers: HashMap<BufferId, Buffer>,
    /// Each importer's leases, by name (the buffers of that name it holds: more than one only
    /// when a name was exported again while it held the old one).
    leases: HashMap<ImporterId, BTreeMap<String, BTreeSet<BufferId>>>,
    next: BufferId,
    figures: BookFigures,
}

impl Book {
    /// An empty book.
    pub fn new() -> Book {
        Book::default()
    }

    /// Exports `spec` under `name`.
    ///
    /// # Errors
    /// [`ShareError::NameTaken`] when the name is exported.
    pub fn publish(&mut self, name: &str, spec: BufferSpec) -> Result<BufferId, ShareError> {
        if self.names.contains_key(name) {
            return Err(ShareError::NameTaken(name.to_string()));
        }
        self.next += 1;
        let id = self.next;
        self.names.insert(name.to_string(), id);
        self.buffers.insert(
            id,
            Buffer {
                name: name.to_string(),
                spec,
                holders: BTreeSet::new(),
                withdrawn: false,
            },
        );
        self.figures.names += 1;
        Ok(id)
    }

    /// The buffer exported under `name` now.
    pub fn get(&self, name: &str) -> Option<(BufferId, &BufferSpec)> {
        let id = *self.names.get(name)?;
        self.buffers.get(&id).map(|b| (id, &b.spec))
    }

    /// Up to `max` exported names after `after` (empty: from the first), in order, and whether
    /// more follow.
    ///
    /// # Time Complexity
    /// O(log names + max).
    pub fn names_after(&self, after: &str, max: usize) -> (Vec<String>, bool) {
        use std::ops::Bound;
        let start = if after.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(after)
        };
        let mut it = self
            .names
            .range::<str, _>((start, Bound::Unbounded))
            .map(|(n, _)| n.clone());
        let page: Vec<String> = it.by_ref().take(max).collect();
        (page, it.next().is_some())
    }

    /// Resolves `name` for `importer`, taking its lease (a second resolve of the same buffer
    /// holds the same lease); `None` when the name is not exported.
    pub fn resolve(&mut self, importer: ImporterId, name: &str) -> Option<&BufferSpec> {
        let id = *self.names.get(name)?;
        let buffer = self.buffers.get_mut(&id)?;
        if buffer.holders.insert(importer) {
            self.figures.leases += 1;
            self.leases
                .entry(importer)
                .or_default()
                .entry(name.to_string())
                .or_default()
                .insert(id);
        }
        Some(&buffer.spec)
    }

    /// Lets go of `importer`'s lease on `id`; whether it held one, and the buffer's id when
    /// that was the last lease of a withdrawn buffer (its block may be freed now).
    fn let_go(&mut self, importer: ImporterId, id: BufferId) -> (bool, Option<BufferId>) {
        let Some(buffer) = self.buffers.get_mut(&id) else {
            return (false, None);
        };
        if !buffer.holders.remove(&importer) {
            return (false, None);
        }
        self.figures.leases -= 1;
        if buffer.withdrawn && buffer.holders.is_empty() {
            self.buffers.remove(&id);
            self.figures.deferred_frees -= 1;
            self.figures.frees_after_wait += 1;
            return (true, Some(id));
        }
        (true, None)
    }

    /// Lets go of `importer`'s leases on `name`: how many it held, and the buffers now free.
    pub fn release(&mut self, importer: ImporterId, name: &str) -> (u32, Vec<BufferId>) {
        let ids = self
            .leases
            .get_mut(&importer)
            .and_then(|by_name| by_name.remove(name))
            .unwrap_or_default();
        self.let_go_all(importer, ids)
    }

    fn let_go_all(
        &mut self,
        importer: ImporterId,
        ids: impl IntoIterator<Item = BufferId>,
    ) -> (u32, Vec<BufferId>) {
        let mut count = 0;
        let mut freed = Vec::new();
        for id in ids {
            let (held, free) = self.let_go(importer, id);
            count += u32::from(held);
            freed.extend(free);
        }
        (count, freed)
    }

    /// Every lease of `importer` goes (its connection closed): the buffers now free.
    pub fn drop_importer(&mut self, importer: ImporterId) -> Vec<BufferId> {
        let ids: Vec<BufferId> = self
            .leases
            .remove(&importer)
            .into_iter()
            .flat_map(|by_name| by_name.into_values().flatten())
            .collect();
        self.let_go_all(importer, ids).1
    }

    /// Withdraws `name` (the exporter frees its block): it resolves no more; the block may be
    /// freed now, or once its importers let go ([`Withdrawal`]).
    ///
    /// # Errors
    /// [`ShareError::UnknownName`] when the name is not exported.
    pub fn withdraw(&mut self, name: &str) -> Result<(BufferId, Withdrawal), ShareError> {
        let id = self
            .names
            .remove(name)
            .ok_or_else(|| ShareError::UnknownName(name.to_string()))?;
        self.figures.names -= 1;
        let holders = self.buffers.get(&id).map_or(0, |b| b.holders.len());
        if holders == 0 {
            self.buffers.remove(&id);
            return Ok((id, Withdrawal::Free));
        }
        if let Some(b) = self.buffers.get_mut(&id) {
            b.withdrawn = true;
        }
        self.figures.deferred_frees += 1;
        self.figures.deferred_total += 1;
        Ok((id, Withdrawal::Deferred { holders }))
    }

    /// The importers holding buffer `id`.
    pub fn holders(&self, id: BufferId) -> usize {
        self.buffers.get(&id).map_or(0, |b| b.holders.len())
    }

    /// Every lease: (importer, buffer, name, spec).
    pub fn leases(&self) -> impl Iterator<Item = (ImporterId, BufferId, &str, &BufferSpec)> {
        self.buffers.iter().flat_map(|(&id, b)| {
            b.holders
                .iter()
                .map(move |&imp| (imp, id, b.name.as_str(), &b.spec))
        })
    }

    /// The figures now.
    pub fn figures(&self) -> BookFigures {
        self.figures
    }
}

#[cfg(test)]
mod tests {
    use super::super::message::tests::spec;
    use super::*;

    #[test]
    fn a_free_waits_for_every_importer_that_holds_the_buffer() {
        let mut book = Book::new();
        let a = book.publish("a", spec(0, 0, 64)).unwrap();
        assert!(matches!(
            book.publish("a", spec(0, 0, 64)),
            Err(ShareError::NameTaken(_))
        ));
        assert!(book.resolve(1, "a").is_some());
        assert!(book.resolve(1, "a").is_some(), "the same lease");
        assert!(book.resolve(2, "a").is_some());
        assert!(book.resolve(2, "nothing").is_none());
        assert_eq!(book.figures().leases, 2);
        assert_eq!(
            book.withdraw("a").unwrap(),
            (a, Withdrawal::Deferred { holders: 2 })
        );
        assert!(
            book.resolve(3, "a").is_none(),
            "withdrawn: resolves no more"
        );
        assert_eq!(book.figures().deferred_frees, 1);
        assert_eq!(book.release(1, "a"), (1, vec![]));
        assert_eq!(book.release(1, "a"), (0, vec![]), "released once");
        assert_eq!(
            book.drop_importer(2),
            vec![a],
            "the last holder died: free now"
        );
        let f = book.figures();
        assert_eq!(
            (
                f.names,
                f.leases,
                f.deferred_frees,
                f.deferred_total,
                f.frees_after_wait
            ),
            (0, 0, 0, 1, 1)
        );
        let b = book.publish("b", spec(0, 0, 64)).unwrap();
        assert_eq!(book.withdraw("b").unwrap(), (b, Withdrawal::Free));
        assert!(matches!(
            book.withdraw("b"),
            Err(ShareError::UnknownName(_))
        ));
    }

    #[test]
    fn a_name_exported_again_is_another_buffer() {
        let mut book = Book::new();
        let old = book.publish("x", spec(0, 0, 64)).unwrap();
        book.resolve(1, "x");
        book.withdraw("x").unwrap();
        let new = book.publish("x", spec(0, 64, 64)).unwrap();
        assert_eq!(book.resolve(1, "x").map(|s| s.offset), Some(64));
        assert_eq!((book.holders(old), book.holders(new)), (1, 1));
        // One release of the name lets go of both.
        assert_eq!(book.release(1, "x"), (2, vec![old]));
        assert_eq!(book.get("x").map(|(id, _)| id), Some(new));
        let (page, more) = book.names_after("", 10);
        assert_eq!((page, more), (vec!["x".to_string()], false));
    }

    #[test]
    fn names_come_in_pages() {
        let mut book = Book::new();
        for i in 0..5 {
            book.publish(&format!("n{i}"), spec(0, 0, 1)).unwrap();
        }
        assert_eq!(
            book.names_after("", 2),
            (vec!["n0".into(), "n1".into()], true)
        );
        assert_eq!(
            book.names_after("n1", 2),
            (vec!["n2".into(), "n3".into()], true)
        );
        assert_eq!(book.names_after("n3", 2), (vec!["n4".into()], false));
        assert_eq!(book.names_after("zzz", 2), (vec![], false));
    }
}
