//! A toy driver of the [`Engine`]: durations from a closure, completions in (time,
//! issue order), every input and action logged. For tests (property tests, the real-store
//! cross-check) and for replaying a recorded input log ([`replay_inputs`]): the engine is
//! a function of its inputs, so the same input log gives the same action log.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::{Deserialize, Serialize};

use super::{Action, Done, Engine, RequestView, ServeError};
use crate::store::Store;

/// One input of the engine, as logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Input {
    /// Request `i` of the trace arrived.
    Arrive(usize),
    /// A unit of work finished.
    Complete(Done),
}

/// What a toy run saw, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Log {
    /// Inputs with their times.
    pub inputs: Vec<(u64, Input)>,
    /// Actions with the time they were decided.
    pub actions: Vec<(u64, Action)>,
}

/// What a hook sees.
pub enum Seen<'e, 'a, S: Store, R: RequestView> {
    /// An input, before the engine takes it.
    Input(u64, &'e Input),
    /// An action, as the driver takes it.
    Action(u64, &'e Action),
    /// The engine after an input and all its actions.
    After(&'e Engine<'a, S, R>),
}

/// Run `engine` over its trace: request `i` arrives at `arrivals[i]`, each action with a
/// completion finishes `duration(now, action)` later (ties in issue order); `hook` sees
/// every input, action and state and may stop the run with an error message.
pub fn drive<'a, S: Store, R: RequestView>(
    engine: &mut Engine<'a, S, R>,
    arrivals: &[u64],
    mut duration: impl FnMut(u64, &Action) -> u64,
    mut hook: impl FnMut(Seen<'_, 'a, S, R>) -> Result<(), String>,
) -> Result<Log, DriveError> {
    let mut log = Log::default();
    let mut q: BinaryHeap<Reverse<(u64, u64, usize)>> = BinaryHeap::new();
    let mut pending: Vec<Done> = Vec::new();
    let mut next = 0usize;
    loop {
        let arrival = arrivals.get(next).copied();
        let event = q.peek().map(|Reverse((t, _, _))| *t);
        let (now, input) = match (arrival, event) {
            (Some(a), Some(t)) if a < t => (a, Input::Arrive(next)),
            (Some(a), None) => (a, Input::Arrive(next)),
            (_, Some(_)) => {
                let Some(Reverse((t, _, slot))) = q.pop() else {
                    break;
                };
                (t, Input::Complete(pending[slot]))
            }
            (None, None) => break,
        };
        hook(Seen::Input(now, &input)).map_err(DriveError::Check)?;
        match input {
            Input::Arrive(i) => {
                engine.arrive(now, i)?;
                next += 1;
            }
            Input::Complete(d) => engine.complete(now, d)?,
        }
        log.inputs.push((now, input));
        while let Some(a) = engine.poll_action() {
            hook(Seen::Action(now, &a)).map_err(DriveError::Check)?;
            let done = match &a {
                Action::Fingerprint { job, .. } => Some(Done::Fingerprinted(*job)),
                Action::Encode { worker, .. }
                | Action::Prefill { worker, .. }
                | Action::Decode { worker, .. } => Some(Done::Step(*worker)),
                Action::Transfer { done, .. } => *done,
                Action::Load { job, .. } => Some(Done::Loaded(*job)),
                Action::EncodeAvoided { .. } => None,
            };
            if let Some(d) = done {
                let seq = pending.len();
                pending.push(d);
                q.push(Reverse((now + duration(now, &a), seq as u64, seq)));
            }
            log.actions.push((now, a));
        }
        hook(Seen::After(engine)).map_err(DriveError::Check)?;
    }
    Ok(log)
}

/// Feed a recorded input log to a fresh engine and return the actions it decides, with
/// their times: no driver, no durations.
pub fn replay_inputs<S: Store, R: RequestView>(
    engine: &mut Engine<'_, S, R>,
    inputs: &[(u64, Input)],
) -> Result<Vec<(u64, Action)>, ServeError> {
    let mut out = Vec::new();
    for &(now, input) in inputs {
        match input {
            Input::Arrive(i) => engine.arrive(now, i)?,
            Input::Complete(d) => engine.complete(now, d)?,
        }
        while let Some(a) = engine.poll_action() {
            out.push((now, a));
        }
    }
    Ok(out)
}

/// Why a toy run stopped.
#[derive(Debug, thiserror::Error)]
pub enum DriveError {
    /// The engine refused an input.
    #[error(transparent)]
    Engine(#[from] ServeError),
    /// A hook's check failed.
    #[error("check failed: {0}")]
    Check(String),
}
