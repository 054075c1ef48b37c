//! [`Above`]: the cells made from a live cell of a link (the calls, the pools whose memory
//! moves), held weakly and told when it grows: the upward edges of the cell graph that
//! [`Calls`](super::Calls) and [`SleepWatch`](super::sleep::SleepWatch) settle by a work list.

use crate::sync::Mutex;
use std::sync::{Arc, Weak};

/// The cells made from one cell (held weakly: a cell above that dropped is forgotten).
#[derive(Debug)]
pub(crate) struct Above<T>(Mutex<Vec<Weak<T>>>);

impl<T> Default for Above<T> {
    fn default() -> Self {
        Above(Mutex::new(Vec::new()))
    }
}

impl<T> Above<T> {
    /// Records `cell`, made from this one (the dropped ones forgotten first).
    pub(crate) fn listen(&self, cell: &Arc<T>) {
        let mut above = self.0.lock();
        above.retain(|w| w.strong_count() > 0);
        above.push(Arc::downgrade(cell));
    }

    /// The cells above that live.
    pub(crate) fn cells(&self) -> Vec<Arc<T>> {
        self.0.lock().iter().filter_map(Weak::upgrade).collect()
    }

    /// How many are recorded (dropped ones included until the next `listen`).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.lock().len()
    }
}
