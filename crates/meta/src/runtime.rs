//! openraft's async runtime for drove: tokio's (its tasks, timers and clock, which
//! the simulator pauses and moves), with one change: openraft's random numbers
//! (each node's election timeout, drawn in its range) come from
//! [`drove_types::random`], so that a simulated run, whose thread is seeded, elects
//! the same leaders at the same times every time it is replayed. In production they
//! come from the operating system as before.
use openraft::{AsyncRuntime, OptionalSend, TokioRuntime};
use std::future::Future;
use std::time::Duration;

type Tokio = TokioRuntime;

/// The runtime of drove's metadata Raft.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DroveRuntime;

impl AsyncRuntime for DroveRuntime {
    type JoinError = <Tokio as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <Tokio as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <Tokio as AsyncRuntime>::Sleep;
    type Instant = <Tokio as AsyncRuntime>::Instant;
    type TimeoutError = <Tokio as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = <Tokio as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = NodeRng;
    type OneshotSender<T: OptionalSend> = <Tokio as AsyncRuntime>::OneshotSender<T>;
    type OneshotReceiverError = <Tokio as AsyncRuntime>::OneshotReceiverError;
    type OneshotReceiver<T: OptionalSend> = <Tokio as AsyncRuntime>::OneshotReceiver<T>;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        Tokio::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        Tokio::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        Tokio::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        Tokio::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        Tokio::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        Tokio::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        NodeRng
    }

    fn oneshot<T: OptionalSend>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>) {
        Tokio::oneshot()
    }
}

/// Random numbers from [`drove_types::random`] (seeded on a simulator's thread).
pub struct NodeRng;

impl rand::RngCore for NodeRng {
    fn next_u32(&mut self) -> u32 {
        drove_types::random::u64() as u32
    }

    fn next_u64(&mut self) -> u64 {
        drove_types::random::u64()
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        drove_types::random::fill(dest);
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        drove_types::random::fill(dest);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn test_election_timeouts_follow_a_seeded_thread() {
        std::thread::spawn(|| {
            let draw = || -> Vec<u64> {
                (0..5)
                    .map(|_| DroveRuntime::thread_rng().gen_range(1500..3000))
                    .collect()
            };
            drove_types::random::seed_thread(7);
            let a = draw();
            drove_types::random::seed_thread(7);
            assert_eq!(a, draw());
            assert!(a.iter().all(|t| (1500..3000).contains(t)));
        })
        .join()
        .unwrap();
    }
}
