//! Client-side rate limit for the Kubernetes API: a token bucket as a tower layer on kube's client stack
//! (ARC's `--k8s-client-rate-limiter-qps/-burst`; kube-rs has no limiter of its own).
//!
//! kube puts the stack behind a single-worker buffer, so `poll_ready` of this service is called for one request
//! at a time; waiting there delays every queued request, as client-go's limiter does.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

/// A token bucket: `burst` tokens, refilled at `qps` per second. Pure; time is passed in.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket. `qps` must be positive; `burst` is at least 1.
    pub fn new(qps: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes a token, or says how long until one is available.
    pub fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.qps))
        }
    }
}

/// Layer adding a [`RateLimit`]; `qps <= 0` disables limiting.
#[derive(Debug, Clone, Copy)]
pub struct RateLimitLayer {
    qps: f64,
    burst: u32,
}

impl RateLimitLayer {
    /// `qps` requests per second on average, bursts of up to `burst`.
    pub fn new(qps: f64, burst: u32) -> Self {
        Self { qps, burst }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            bucket: (self.qps > 0.0)
                .then(|| TokenBucket::new(self.qps, self.burst, Instant::now())),
            sleep: None,
            reserved: false,
        }
    }
}

/// The rate-limited service.
#[derive(Debug)]
pub struct RateLimit<S> {
    inner: S,
    bucket: Option<TokenBucket>,
    sleep: Option<Pin<Box<Sleep>>>,
    /// A token was taken for the next `call`; `poll_ready` may be called again before it without taking another.
    reserved: bool,
}

impl<S, R> Service<R> for RateLimit<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let Some(bucket) = self.bucket.as_mut() else {
            return self.inner.poll_ready(cx);
        };
        loop {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            if self.reserved {
                return self.inner.poll_ready(cx);
            }
            match bucket.try_take(Instant::now()) {
                Ok(()) => self.reserved = true,
                Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
    }

    fn call(&mut self, request: R) -> Self::Future {
        self.reserved = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_then_refills_at_the_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(10.0, 3, start);
        for _ in 0..3 {
            assert_eq!(bucket.try_take(start), Ok(()));
        }
        let wait = bucket.try_take(start).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        assert_eq!(bucket.try_take(start + Duration::from_millis(100)), Ok(()));
        // A long pause refills at most `burst` tokens.
        let later = start + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(bucket.try_take(later), Ok(()));
        }
        assert!(bucket.try_take(later).is_err());
    }

    #[test]
    fn zero_burst_still_allows_one_request() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(1.0, 0, start);
        assert_eq!(bucket.try_take(start), Ok(()));
        assert!(bucket.try_take(start).is_err());
    }

    /// Answers each request with the time it was called.
    struct Clock;

    impl Service<()> for Clock {
        type Response = Instant;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Instant, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, (): ()) -> Self::Future {
            std::future::ready(Ok(Instant::now()))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_service_waits_for_tokens() {
        let mut service = RateLimitLayer::new(2.0, 1).layer(Clock);
        let start = Instant::now();
        let mut times = Vec::new();
        for _ in 0..3 {
            std::future::poll_fn(|cx| service.poll_ready(cx))
                .await
                .unwrap();
            times.push(service.call(()).await.unwrap());
        }
        assert_eq!(times[0] - start, Duration::ZERO);
        assert_eq!(times[1] - start, Duration::from_millis(500));
        assert_eq!(times[2] - start, Duration::from_millis(1000));
    }
}
