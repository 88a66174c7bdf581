//! Miss penalties: per-block KV penalties add up to the prefill of the whole prompt, and
//! `LinearCost`'s defaults are a fit of the same roofline (Qwen2.5-VL-7B on one H200).

use moonagent_sim::replay::{LinearCost, MissCost, ModelCost};

#[test]
fn kv_block_penalties_sum_to_the_full_prefill() {
    let m = ModelCost::qwen25_vl_7b_h200();
    for (prompt, bs) in [(4_700u64, 64u32), (12_035, 512), (100, 64), (64, 64)] {
        let mut sum = 0;
        let mut start = 0;
        while start < prompt {
            let t = (prompt - start).min(u64::from(bs)) as u32;
            sum += m.kv_block_ns(t, start);
            start += u64::from(t);
        }
        assert_eq!(sum, m.kv_block_ns(prompt as u32, 0), "prompt {prompt}");
    }
    // Sanity of scale: a 4k-token prefill is tens to hundreds of ms, one image ~10 ms.
    let p = m.kv_block_ns(4096, 0);
    assert!((20_000_000..400_000_000).contains(&p), "{p}");
    let e = m.image_ns(1008);
    assert!((2_000_000..60_000_000).contains(&e), "{e}");
}

#[test]
fn linear_cost_default_is_a_fit_of_the_roofline() {
    let m = ModelCost::qwen25_vl_7b_h200();
    let l = LinearCost::default();
    assert_eq!(l, LinearCost::fit(&m));
    let close = |a: u64, b: u64| (a as f64 - b as f64).abs() <= 0.15 * b as f64;
    for v in [256, 1008, 2304] {
        assert!(close(l.image_ns(v), m.image_ns(v)), "image {v}");
    }
    for (t, p) in [(512u32, 0u64), (512, 8192), (4096, 0), (64, 16_000)] {
        assert!(
            close(l.kv_block_ns(t, p), m.kv_block_ns(t, p)),
            "kv {t} after {p}: {} vs {}",
            l.kv_block_ns(t, p),
            m.kv_block_ns(t, p)
        );
    }
}
