//! Walking a stack of resources (adaptors over suballocators over source resources, binning's
//! bins) without recursion: how deep it is and whether it reaches a given resource. Stacks are
//! built by users, from Python too, so a walk must neither overflow the stack nor loop on a
//! cycle (a binning resource added as its own bin).

use super::{MemoryResource, SharedResource};
use crate::error::{Error, Result};
use std::collections::HashMap;

/// The deepest stack rrmm builds: an allocation calls one resource per level (with a few
/// hundred bytes of machine stack each), and dropping the stack drops one per level.
pub const MAX_STACK_DEPTH: usize = 256;

/// Identity of a resource in a walk: clones of a handle type (which share their state) count as
/// one resource ([`MemoryResource::identity`]).
fn id(mr: &dyn MemoryResource) -> usize {
    mr.identity()
}

/// The number of levels from `mr` down to its deepest source resource (1 for a source resource).
///
/// # Errors
/// [`Error::Logic`] when the stack has a cycle (a resource reaches itself).
///
/// # Time Complexity
/// O(resources + edges) of the stack, with a heap-allocated stack of its own.
pub fn depth(mr: &SharedResource) -> Result<usize> {
    enum Visit {
        Enter(SharedResource),
        Leave(usize, Vec<SharedResource>),
    }
    // id -> depth (done) or 0 (on the current path).
    let mut known: HashMap<usize, usize> = HashMap::new();
    let mut todo = vec![Visit::Enter(mr.clone())];
    while let Some(visit) = todo.pop() {
        match visit {
            Visit::Enter(node) => {
                let key = id(&*node);
                match known.get(&key) {
                    Some(0) => {
                        return Err(Error::Logic(format!(
                            "the resource stack has a cycle: {} reaches itself",
                            node.name()
                        )))
                    }
                    Some(_) => continue,
                    None => {}
                }
                known.insert(key, 0);
                let ups = node.upstreams();
                todo.push(Visit::Leave(key, ups.clone()));
                todo.extend(ups.into_iter().map(Visit::Enter));
            }
            Visit::Leave(key, ups) => {
                let below = ups
                    .iter()
                    .map(|u| known.get(&id(&**u)).copied().unwrap_or(0))
                    .max()
                    .unwrap_or(0);
                known.insert(key, below + 1);
            }
        }
    }
    Ok(known.get(&id(&**mr)).copied().unwrap_or(1))
}

/// Whether `from` is `target` or reaches it through its upstreams.
///
/// # Time Complexity
/// O(resources + edges) of the stack below `from`.
pub fn reaches(from: &SharedResource, target: &dyn MemoryResource) -> bool {
    let goal = id(target);
    let mut seen = std::collections::HashSet::new();
    let mut todo = vec![from.clone()];
    while let Some(node) = todo.pop() {
        let key = id(&*node);
        if key == goal {
            return true;
        }
        if seen.insert(key) {
            todo.extend(node.upstreams());
        }
    }
    false
}

/// An error unless a resource built over `upstream` (one level above it) stays within
/// [`MAX_STACK_DEPTH`] and has no cycle. `name` is the argument, for the message.
///
/// # Errors
/// [`Error::InvalidArgument`] naming `name`.
pub fn check_upstream(name: &'static str, upstream: &SharedResource) -> Result<()> {
    let below = depth(upstream).map_err(|e| Error::invalid(name, e.to_string()))?;
    if below + 1 > MAX_STACK_DEPTH {
        return Err(Error::invalid(
            name,
            format!(
                "a resource over it would make a stack {} resources deep; rrmm builds stacks of \
                 at most {MAX_STACK_DEPTH}",
                below + 1
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BinningMemoryResource, SimulatedMemoryResource, StatisticsResourceAdaptor};
    use std::sync::Arc;

    #[test]
    fn depth_counts_levels_and_shared_nodes_once() {
        let sim: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 30));
        assert_eq!(depth(&sim).unwrap(), 1);
        let mut top = sim.clone();
        for _ in 0..10 {
            top = Arc::new(StatisticsResourceAdaptor::new(top));
        }
        assert_eq!(depth(&top).unwrap(), 11);
        assert!(reaches(&top, &*sim));
        assert!(!reaches(&sim, &*top));
        // A wide graph: many bins over one upstream.
        let b = BinningMemoryResource::new(sim.clone(), Some(8), Some(20)).unwrap();
        let b: SharedResource = Arc::new(b);
        assert_eq!(
            depth(&b).unwrap(),
            3,
            "binning -> fixed-size bins -> device"
        );
        check_upstream("upstream_mr", &top).unwrap();
    }

    #[test]
    fn deep_stacks_are_refused_without_recursion() {
        let mut top: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 30));
        for _ in 0..MAX_STACK_DEPTH - 1 {
            top = Arc::new(StatisticsResourceAdaptor::new(top));
        }
        assert_eq!(depth(&top).unwrap(), MAX_STACK_DEPTH);
        let e = check_upstream("upstream_mr", &top).unwrap_err();
        assert!(e.to_string().contains("at most 256"), "{e}");
    }
}
