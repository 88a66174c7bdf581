//! Multi-image planning: offsets, de-duplication, only misses encoded, readback through
//! the validated path, the seed's `multi_image_agent` numbers, and outputs that always
//! equal a fresh encoding, faults or not.

use moonagent_core::faulty::{FaultKind, FaultRates, FaultyStore};
use moonagent_core::fingerprint::{GridThw, ImageFp, ModelParts};
use moonagent_core::mm_cache::demo::{
    multi_image_agent_session_with, replay_pass, toy_embedding, toy_encoder, DemoScale,
};
use moonagent_core::mm_cache::{
    CacheError, EncodeJob, ImageInput, Lookup, MmCache, ModelCtx, PlanMode, SegmentSource,
};
use moonagent_core::store::{MemStore, MemStoreConfig, MS};
use proptest::prelude::*;

fn ctx() -> ModelCtx {
    ModelCtx::new(ModelParts::example("alice"), 4).expect("valid ctx")
}

fn store() -> MemStore<String> {
    MemStore::new(MemStoreConfig::with_capacity(64 << 20)).expect("valid config")
}

fn img(tag: u8, t: u64, h: u64, w: u64) -> ImageInput {
    ImageInput {
        fp: ImageFp([tag; 32]),
        grid: GridThw::new(t, h, w),
    }
}

fn check_outputs(plan: &moonagent_core::mm_cache::Plan) {
    let mut want = Vec::new();
    for (i, s) in plan.segments.iter().enumerate() {
        want.resize(s.byte_len as usize, 0);
        toy_embedding(&s.fp, &mut want);
        assert_eq!(plan.segment_bytes(i), Some(want.as_slice()), "segment {i}");
    }
}

#[test]
fn offsets_are_cumulative_in_patch_and_post_merge_domains() {
    let ctx = ctx(); // merge 2, hidden 4, bf16: 8 bytes per token
    let mut c = MmCache::new(store());
    let images = [img(1, 1, 4, 6), img(2, 2, 2, 2), img(3, 1, 8, 4)];
    let plan = c
        .plan_request(0, &ctx, &images, PlanMode::Bytes)
        .expect("plan");
    let got: Vec<_> = plan
        .segments
        .iter()
        .map(|s| {
            (
                s.patch_offset,
                s.patches,
                s.token_offset,
                s.tokens,
                s.byte_offset,
                s.byte_len,
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (0, 24, 0, 6, 0, 48),
            (24, 8, 6, 2, 48, 16),
            (32, 32, 8, 8, 64, 64)
        ]
    );
    let r = plan.requests[0];
    assert_eq!((r.patches, r.tokens, r.bytes), (64, 16, 128));
    assert_eq!(plan.output(0).map(<[u8]>::len), Some(128));
}

#[test]
fn only_distinct_misses_go_to_the_encoder_once_per_plan() {
    let ctx = ctx();
    let mut c = MmCache::new(store());
    let (a, b) = (img(1, 1, 2, 2), img(2, 1, 4, 2));
    let mut calls = Vec::new();
    let mut enc = |jobs: &[EncodeJob], outs: &mut [Vec<u8>]| {
        calls.push(jobs.iter().map(|j| j.fp).collect::<Vec<_>>());
        toy_encoder(jobs, outs)
    };
    // In-request duplicates.
    let plan = c
        .run_request(0, &ctx, &[a, b, a, a], &mut enc)
        .expect("run");
    check_outputs(&plan);
    assert_eq!(plan.duplicates(), 2);
    assert_eq!(plan.segments[2].source, SegmentSource::Duplicate { of: 0 });
    // In-batch duplicates across requests, all hits now.
    let plan = c
        .run_batch(MS, &ctx, &[&[b, a], &[a, b]], &mut enc)
        .expect("run");
    check_outputs(&plan);
    assert_eq!(plan.hits(), 2);
    assert_eq!(plan.duplicates(), 2);
    assert_eq!(calls, vec![vec![a.fp, b.fp]]);
    let k = c.counters();
    assert_eq!((k.encoder_calls, k.images_encoded, k.dedup), (1, 2, 4));
    assert_eq!(
        (k.lookups, k.hits, k.readbacks, k.readback_hits),
        (4, 2, 2, 2)
    );
    assert_eq!(k.images_planned, 8);
}

#[test]
fn partial_hits_encode_only_the_missing_images() {
    let ctx = ctx();
    let mut c = MmCache::new(store());
    let (a, b, d) = (img(1, 1, 2, 2), img(2, 1, 4, 2), img(3, 1, 2, 4));
    c.run_request(0, &ctx, &[a, b], toy_encoder).expect("run");
    let plan = c
        .plan_request(MS, &ctx, &[b, d, a], PlanMode::Bytes)
        .expect("plan");
    assert_eq!(plan.jobs.len(), 1);
    assert_eq!(plan.jobs[0].fp, d.fp);
    assert_eq!(plan.segments[1].source, SegmentSource::Encode { job: 0 });
    assert_eq!(plan.hits(), 2);
}

#[test]
fn multi_image_agent_matches_the_seed_and_second_pass_encodes_nothing() {
    let session = multi_image_agent_session_with(DemoScale::Tiny).expect("session");
    let mut c = MmCache::new(store());
    let first = replay_pass(&mut c, &session, 0).expect("pass 1");
    assert_eq!(first.encoder_calls, 3);
    assert_eq!(first.cache_objects, 4);
    assert_eq!(first.images_encoded, 4);
    assert_eq!(
        (first.lookups, first.hits, first.readbacks, first.dedup),
        (6, 2, 4, 1)
    );
    assert_eq!(first.wrong_segments, 0);
    assert_eq!(first.verified_segments, 7);
    let second = replay_pass(&mut c, &session, 1_000 * MS).expect("pass 2");
    assert_eq!(second.encoder_calls, 0);
    assert_eq!(second.images_encoded, 0);
    assert_eq!((second.lookups, second.hits, second.readbacks), (6, 6, 0));
    assert_eq!(second.wrong_segments, 0);
    assert_eq!((second.corrupt_meta, second.corrupt_blob), (0, 0));
}

#[test]
fn demo_session_has_three_turns_and_the_8_6_mb_image() {
    let s = multi_image_agent_session_with(DemoScale::Tiny).expect("session");
    // The chart: grid 1x46x104, merge 2 -> 1196 visual tokens, x 7168 B at full scale.
    assert_eq!(s.images[1].input.grid.visual_tokens(2), Some(1196));
    assert_eq!(s.turns.len(), 3);
    let full = ModelCtx::new(ModelParts::example("demo"), 3584).expect("ctx");
    assert_eq!(full.token_bytes(), 7168);
}

#[test]
fn size_only_plan_runs_the_same_semantics_without_bytes() {
    let ctx = ctx();
    let mut c = MmCache::new(store());
    let (a, b) = (img(1, 1, 2, 2), img(2, 1, 4, 2));
    let mut plan = c
        .plan_request(0, &ctx, &[a, b, a], PlanMode::SizeOnly)
        .expect("plan");
    assert_eq!(plan.jobs.len(), 2);
    c.complete(MS, &ctx, &mut plan, &[]).expect("complete");
    assert!(plan
        .segments
        .iter()
        .filter(|s| matches!(s.source, SegmentSource::Encode { .. }))
        .all(|s| matches!(s.readback, Some(Lookup::Hit { .. }))));
    let plan = c
        .plan_request(2 * MS, &ctx, &[b, a], PlanMode::SizeOnly)
        .expect("plan");
    assert_eq!(plan.hits(), 2);
    assert_eq!(c.counters().readback_hits, 2);
    assert!(c.store().used_bytes() > 0);
}

#[test]
fn failed_readback_falls_back_to_the_encoders_bytes_and_is_counted() {
    let ctx = ctx();
    let mut c = MmCache::new(FaultyStore::new(store(), 3));
    c.store_mut().push_fault(FaultKind::DropMeta);
    let a = img(1, 1, 2, 2);
    let plan = c.run_request(0, &ctx, &[a], toy_encoder).expect("run");
    check_outputs(&plan);
    assert_eq!(c.counters().readback_fallbacks, 1);
    assert_eq!(c.counters().readback_misses, 1);
    assert_eq!(c.counters().misses.not_found, 2);
}

#[test]
fn corrupt_blob_on_readback_is_a_miss_and_the_encoders_bytes_are_used() {
    // The blob put of the commit stores flipped bytes: the readback must verify the
    // checksum, miss, delete the pair and fall back; a readback that skips the checksum
    // would hand the flipped bytes to the request.
    let ctx = ctx();
    let mut c = MmCache::new(FaultyStore::new(store(), 5));
    c.store_mut().push_fault_for(
        FaultKind::CorruptBlob,
        moonagent_core::mm_cache::BLOB_PREFIX,
    );
    let a = img(1, 1, 2, 2);
    let plan = c.run_request(0, &ctx, &[a], toy_encoder).expect("run");
    assert_eq!(c.store().injected(FaultKind::CorruptBlob), 1);
    assert_eq!(
        plan.segments[0].readback,
        Some(Lookup::Miss(
            moonagent_core::mm_cache::MissReason::CorruptBlob
        ))
    );
    check_outputs(&plan);
    let k = c.counters();
    assert_eq!((k.readback_hits, k.readback_misses), (0, 1));
    assert_eq!((k.readback_fallbacks, k.pairs_deleted), (1, 1));
    assert_eq!(k.misses.corrupt_blob, 1);
}

#[test]
fn encoder_failure_and_bad_input_are_errors() {
    let ctx = ctx();
    let mut c = MmCache::new(store());
    let r = c.run_request(0, &ctx, &[img(1, 1, 2, 2)], |_, _| Err("oom".into()));
    assert_eq!(r.err(), Some(CacheError::Encoder("oom".into())));
    let r = c.plan_request(0, &ctx, &[img(1, 1, 3, 2)], PlanMode::Bytes);
    assert!(matches!(r, Err(CacheError::InvalidInput(_))));
    // The same fingerprint with two grids is inconsistent input.
    let r = c.plan_request(
        0,
        &ctx,
        &[img(1, 1, 2, 2), img(1, 1, 4, 2)],
        PlanMode::Bytes,
    );
    assert!(matches!(r, Err(CacheError::InvalidInput(_))));
}

fn toy_encoded(plan: &moonagent_core::mm_cache::Plan) -> Vec<Vec<u8>> {
    plan.jobs
        .iter()
        .map(|j| {
            let mut v = vec![0u8; j.byte_len as usize];
            toy_embedding(&j.fp, &mut v);
            v
        })
        .collect()
}

fn emb(i: &ImageInput, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    toy_embedding(&i.fp, &mut v);
    v
}

#[test]
fn take_outputs_hands_over_each_requests_embedding_and_completion_is_flagged() {
    let ctx = ctx(); // merge 2, hidden 4, bf16: 8 bytes per token
    let mut c = MmCache::new(store());
    let (a, b) = (img(1, 1, 2, 2), img(2, 1, 4, 2)); // 1 and 2 tokens: 8 and 16 bytes
    let mut plan = c
        .plan_batch(0, &ctx, &[&[a], &[b, a]], PlanMode::Bytes)
        .expect("plan");
    assert!(!plan.is_complete(), "planned, not completed");
    let encoded = toy_encoded(&plan);
    c.complete(0, &ctx, &mut plan, &encoded).expect("complete");
    assert!(plan.is_complete());
    let want = vec![emb(&a, 8), [emb(&b, 16), emb(&a, 8)].concat()];
    assert_eq!(plan.take_outputs(), want);
    // Taken: nothing is left behind.
    assert_eq!(plan.output(0), None);
    assert!(plan.take_outputs().is_empty());
}

#[test]
fn a_zero_token_image_and_its_duplicate_complete_with_empty_embeddings() {
    // t = 0 frames: zero patches, zero tokens, zero bytes; the duplicate copies the empty
    // range [0, 0) of a 0-byte output, which is in range.
    let ctx = ctx();
    let mut c = MmCache::new(store());
    let z = img(9, 0, 2, 2);
    let plan = c.run_request(0, &ctx, &[z, z], toy_encoder).expect("run");
    assert_eq!(plan.duplicates(), 1);
    assert_eq!(plan.output(0), Some(&[][..]));
    // After a real image the first occurrence's empty range ends at the output's end.
    let a = img(1, 1, 2, 2);
    let plan = c
        .run_request(MS, &ctx, &[a, z, z], toy_encoder)
        .expect("run");
    assert_eq!(plan.segments[2].source, SegmentSource::Duplicate { of: 1 });
    assert_eq!(plan.output(0), Some(emb(&a, 8).as_slice()));
}

#[test]
fn a_duplicate_whose_first_occurrence_ends_the_output_is_filled() {
    // The plan's segments are public: a driver may lay the two copies of `a` out the
    // other way round. The first occurrence then ends exactly at the end of the output
    // (in range), and the duplicate at the front is filled from it.
    let ctx = ctx();
    let mut c = MmCache::new(store());
    let a = img(1, 1, 2, 2); // 8 bytes
    let mut plan = c
        .plan_request(0, &ctx, &[a, a], PlanMode::Bytes)
        .expect("plan");
    assert_eq!(plan.segments[1].source, SegmentSource::Duplicate { of: 0 });
    plan.segments[0].byte_offset = 8;
    plan.segments[1].byte_offset = 0;
    let encoded = toy_encoded(&plan);
    c.complete(0, &ctx, &mut plan, &encoded).expect("complete");
    assert_eq!(
        plan.output(0),
        Some([emb(&a, 8), emb(&a, 8)].concat().as_slice())
    );
}

#[test]
fn a_duplicate_edited_out_of_its_output_is_an_error_not_a_panic() {
    let ctx = ctx();
    let mut c = MmCache::new(store());
    let a = img(1, 1, 2, 2); // 8 bytes; the output is 16
    for offset in [9, 16, 1000] {
        let mut plan = c
            .plan_request(0, &ctx, &[a, a], PlanMode::Bytes)
            .expect("plan");
        assert_eq!(plan.segments[1].source, SegmentSource::Duplicate { of: 0 });
        // The source [0, 8) is in range; the destination [offset, offset + 8) is not.
        plan.segments[1].byte_offset = offset;
        let encoded = toy_encoded(&plan);
        let r = c.complete(0, &ctx, &mut plan, &encoded);
        assert!(
            matches!(r, Err(CacheError::InvalidInput(_))),
            "{offset}: {r:?}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// Whatever faults strike, every segment a completed plan returns equals a fresh
    /// encoding of its image, and the encoder sees each distinct miss exactly once.
    #[test]
    fn plan_output_always_equals_fresh_encoding(
        seed in any::<u64>(),
        rate in 0u32..60,
        batches in proptest::collection::vec(
            proptest::collection::vec(proptest::collection::vec(0usize..6, 1..5), 1..3), 1..24),
    ) {
        let ctx = ctx();
        let mut rates = FaultRates::uniform(f64::from(rate) / 1000.0);
        // Client failures end a plan with an error; keep them rarer.
        rates.unavailable /= 4.0;
        rates.buffer_registration /= 4.0;
        let mut c = MmCache::new(FaultyStore::new(store(), seed).with_rates(rates));
        let pool: Vec<ImageInput> = (0..6u8)
            .map(|i| img(i + 1, 1, 2 * (1 + u64::from(i % 3)), 2))
            .collect();
        for (n, batch) in batches.iter().enumerate() {
            let reqs: Vec<Vec<ImageInput>> =
                batch.iter().map(|r| r.iter().map(|&i| pool[i]).collect()).collect();
            let refs: Vec<&[ImageInput]> = reqs.iter().map(Vec::as_slice).collect();
            let mut seen = Vec::new();
            let r = c.run_batch(n as u64 * MS, &ctx, &refs, |jobs, outs| {
                seen.extend(jobs.iter().map(|j| j.fp));
                toy_encoder(jobs, outs)
            });
            match r {
                Ok(plan) => {
                    check_outputs(&plan);
                    let mut distinct = seen.clone();
                    distinct.sort();
                    distinct.dedup();
                    prop_assert_eq!(distinct.len(), seen.len());
                    prop_assert_eq!(seen.len(), plan.jobs.len());
                }
                Err(CacheError::Store(e)) => prop_assert!(e.is_client_failure()),
                Err(e) => return Err(TestCaseError::fail(format!("{e}"))),
            }
        }
    }
}
