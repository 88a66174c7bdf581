//! The CPU `Compute` on the tiny spec: output sizes are the spec's, outputs are
//! deterministic, and the paged KV gives the same bytes and tokens however a sequence is
//! split into calls and whatever page ids it uses.

use std::sync::OnceLock;

use moonagent_models::ModelSpec;
use moonagent_validation::compute::{
    text_token, Compute, ComputeError, CpuCompute, DecodeSeq, ImageInput, KvArena, KvPages,
    PrefillChunk, Rows,
};

/// Tokens per KV page in these tests (sequences straddle page boundaries).
const PT: u32 = 16;

fn tiny() -> &'static CpuCompute {
    static C: OnceLock<CpuCompute> = OnceLock::new();
    C.get_or_init(|| {
        let spec = ModelSpec::by_name("qwen2.5-vl-tiny").unwrap();
        CpuCompute::new(&spec, 7).unwrap()
    })
}

fn image(tokens: u32, seed: u64) -> Vec<u8> {
    tiny()
        .encode(&[ImageInput {
            visual_tokens: tokens,
            seed,
        }])
        .unwrap()
        .pop()
        .unwrap()
}

/// One prefill chunk on a fresh arena of 16 pages; (next token, arena).
fn prefill_one(pages: &[u32], cached: u32, inputs: &[Rows<'_>], kv: &mut KvArena) -> u32 {
    tiny()
        .prefill(
            kv,
            &[PrefillChunk {
                pages,
                cached,
                inputs,
            }],
        )
        .unwrap()[0]
}

#[test]
fn output_sizes_are_the_specs() {
    let c = tiny();
    // Encoder output: 256 out_hidden * 2 bytes (bf16) = 512 bytes per visual token.
    let imgs: Vec<ImageInput> = [1u32, 3, 16, 41, 0]
        .iter()
        .enumerate()
        .map(|(i, &t)| ImageInput {
            visual_tokens: t,
            seed: i as u64,
        })
        .collect();
    let out = c.encode(&imgs).unwrap();
    assert_eq!(out.len(), imgs.len());
    for (img, o) in imgs.iter().zip(&out) {
        assert_eq!(o.len(), img.visual_tokens as usize * 512);
        assert_eq!(
            o.len() as u64,
            u64::from(img.visual_tokens) * c.spec().encoder_output_bytes_per_token()
        );
    }
    assert!(c.encode(&[]).unwrap().is_empty());
    // KV: 2 * 6 layers * 2 kv heads * 32 head dim * 2 bytes = 1,536 bytes per token.
    let mut kv = c.new_kv(8, PT).unwrap();
    assert_eq!(kv.page_bytes(), 16 * 1536);
    let pages = [3, 1, 6];
    for n in [1u32, 15, 16, 17, 40] {
        prefill_one(&pages, 0, &[Rows::Text { seed: 1, count: n }], &mut kv);
        assert_eq!(kv.read_tokens(&pages, n).unwrap().len(), n as usize * 1536);
    }
}

#[test]
fn encode_is_deterministic_seed_sensitive_and_batch_independent() {
    let c = tiny();
    let a = ImageInput {
        visual_tokens: 20,
        seed: 11,
    };
    let b = ImageInput {
        visual_tokens: 9,
        seed: 12,
    };
    let first = c.encode(&[a, b]).unwrap();
    let again = c.encode(&[a, b]).unwrap();
    assert_eq!(first, again);
    // Alone or in a batch (either order), an image encodes to the same bytes.
    assert_eq!(c.encode(&[a]).unwrap()[0], first[0]);
    assert_eq!(c.encode(&[b, a]).unwrap()[1], first[0]);
    // Another seed is another image.
    let other = c.encode(&[ImageInput { seed: 13, ..a }]).unwrap();
    assert_ne!(other[0], first[0]);
    // Outputs are finite and not all zero.
    let vals: Vec<f32> = first[0]
        .chunks_exact(2)
        .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect();
    assert!(vals.iter().all(|v| v.is_finite()));
    assert!(vals.iter().any(|v| *v != 0.0));
    // Other weights (seed) give other outputs.
    let spec = ModelSpec::by_name("qwen2.5-vl-tiny").unwrap();
    let c8 = CpuCompute::new(&spec, 8).unwrap();
    assert_ne!(c8.encode(&[a]).unwrap()[0], first[0]);
}

#[test]
fn prefill_is_deterministic() {
    let img = image(12, 5);
    let inputs = [
        Rows::Text { seed: 3, count: 7 },
        Rows::Image {
            encoder_output: &img,
            first: 0,
            count: 12,
        },
        Rows::Text { seed: 3, count: 9 },
    ];
    let pages = [0, 1];
    let mut kv1 = tiny().new_kv(4, PT).unwrap();
    let mut kv2 = tiny().new_kv(4, PT).unwrap();
    let t1 = prefill_one(&pages, 0, &inputs, &mut kv1);
    let t2 = prefill_one(&pages, 0, &inputs, &mut kv2);
    assert_eq!(t1, t2);
    assert_eq!(kv1, kv2);
    // Another prompt text gives other KV bytes.
    let mut kv3 = tiny().new_kv(4, PT).unwrap();
    let other = [Rows::Text { seed: 4, count: 7 }, inputs[1], inputs[2]];
    prefill_one(&pages, 0, &other, &mut kv3);
    assert_ne!(
        kv1.read_tokens(&pages, 28).unwrap(),
        kv3.read_tokens(&pages, 28).unwrap()
    );
}

/// A prompt of text, image rows and text: 37 tokens, across page boundaries.
fn prompt(img: &[u8]) -> [Rows<'_>; 3] {
    [
        Rows::Text { seed: 9, count: 10 },
        Rows::Image {
            encoder_output: img,
            first: 0,
            count: 16,
        },
        Rows::Text { seed: 9, count: 11 },
    ]
}

#[test]
fn prefill_then_decode_equals_one_longer_prefill() {
    let img = image(16, 21);
    let n = 37u32;
    let pages = [2, 0, 3];
    // Path A: prefill n tokens, then decode the returned token at position n.
    let mut a = tiny().new_kv(4, PT).unwrap();
    let t = prefill_one(&pages, 0, &prompt(&img), &mut a);
    let next_a = tiny()
        .decode(
            &mut a,
            &[DecodeSeq {
                pages: &pages,
                len: n,
                token: t,
            }],
        )
        .unwrap()[0];
    // Path B: one prefill of n + 1 tokens whose last input row is that same token.
    let mut b = tiny().new_kv(4, PT).unwrap();
    let p = prompt(&img);
    let tok = [t];
    let longer = [p[0], p[1], p[2], Rows::Tokens(&tok)];
    let next_b = prefill_one(&pages, 0, &longer, &mut b);
    assert_eq!(next_a, next_b);
    // Bit-identical KV: every row's GEMM results do not depend on the other rows, and
    // attention reads the stored (bf16) keys of exactly positions 0..=p in both paths.
    assert_eq!(
        a.read_tokens(&pages, n + 1).unwrap(),
        b.read_tokens(&pages, n + 1).unwrap()
    );
    assert_eq!(a, b);
    // A few more decode steps keep producing tokens in the vocabulary.
    let mut tok = next_a;
    for len in n + 1..n + 6 {
        tok = tiny()
            .decode(
                &mut a,
                &[DecodeSeq {
                    pages: &pages,
                    len,
                    token: tok,
                }],
            )
            .unwrap()[0];
        assert!(tok < 4096);
    }
}

#[test]
fn page_ids_do_not_change_results() {
    let img = image(16, 22);
    let contiguous = [0, 1, 2];
    let scattered = [13, 4, 9];
    let mut a = tiny().new_kv(16, PT).unwrap();
    let mut b = tiny().new_kv(16, PT).unwrap();
    let ta = prefill_one(&contiguous, 0, &prompt(&img), &mut a);
    let tb = prefill_one(&scattered, 0, &prompt(&img), &mut b);
    assert_eq!(ta, tb);
    let da = tiny()
        .decode(
            &mut a,
            &[DecodeSeq {
                pages: &contiguous,
                len: 37,
                token: ta,
            }],
        )
        .unwrap();
    let db = tiny()
        .decode(
            &mut b,
            &[DecodeSeq {
                pages: &scattered,
                len: 37,
                token: tb,
            }],
        )
        .unwrap();
    assert_eq!(da, db);
    assert_eq!(
        a.read_tokens(&contiguous, 38).unwrap(),
        b.read_tokens(&scattered, 38).unwrap()
    );
    // The bytes really are in the scattered pages (and page-for-page the same).
    let mut pa = vec![0u8; a.page_bytes()];
    let mut pb = vec![0u8; b.page_bytes()];
    for (x, y) in contiguous.iter().zip(&scattered) {
        a.read_page(*x, &mut pa).unwrap();
        b.read_page(*y, &mut pb).unwrap();
        assert_eq!(pa, pb);
        assert!(pb.iter().any(|v| *v != 0));
    }
    b.read_page(0, &mut pb).unwrap();
    assert!(pb.iter().all(|v| *v == 0), "page 0 is not in the table");
}

#[test]
fn chunked_prefill_equals_one_prefill() {
    let img = image(16, 23);
    let pages = [5, 1, 7];
    let mut one = tiny().new_kv(8, PT).unwrap();
    let t_one = prefill_one(&pages, 0, &prompt(&img), &mut one);
    // Two chunks of 18 and 19 rows; the split falls inside the image.
    let mut two = tiny().new_kv(8, PT).unwrap();
    let first = [
        Rows::Text { seed: 9, count: 10 },
        Rows::Image {
            encoder_output: &img,
            first: 0,
            count: 8,
        },
    ];
    let second = [
        Rows::Image {
            encoder_output: &img,
            first: 8,
            count: 8,
        },
        Rows::Text { seed: 9, count: 11 },
    ];
    prefill_one(&pages, 0, &first, &mut two);
    let t_two = prefill_one(&pages, 18, &second, &mut two);
    assert_eq!(t_one, t_two);
    assert_eq!(one, two);
    // Text ids follow absolute positions, so the second text run continues the first's.
    let ids: Vec<u32> = (26..37).map(|p| text_token(9, p, 4096)).collect();
    let mut three = tiny().new_kv(8, PT).unwrap();
    let third = [second[0], Rows::Tokens(&ids)];
    prefill_one(&pages, 0, &first, &mut three);
    assert_eq!(prefill_one(&pages, 18, &third, &mut three), t_one);
    assert_eq!(one, three);
}

/// Attention is two GEMMs over a block of query rows and all the keys the block needs
/// (`S = Q K^T`, `O = P V`). Bit-identity across call shapes holds by construction:
/// sgemm's value for one output element does not depend on the matrix shape, and `P V`
/// sums over keys in fixed blocks of 256 from key 0 (`matrixmultiply`'s `kc`), where the
/// masked (zero) probabilities past a row's last key add nothing. Sequences longer than
/// one such block, split at points inside and across blocks, check that here.
#[test]
fn long_sequences_are_bit_identical_across_call_shapes() {
    let n = 300u32;
    let pages: Vec<u32> = (0..20).rev().collect();
    // One prefill of n + 1 tokens.
    let mut one = tiny().new_kv(20, PT).unwrap();
    let t_one = prefill_one(
        &pages,
        0,
        &[Rows::Text {
            seed: 4,
            count: n + 1,
        }],
        &mut one,
    );
    // Prefill of n, then decode the (n + 1)-th text token.
    let mut dec = tiny().new_kv(20, PT).unwrap();
    prefill_one(&pages, 0, &[Rows::Text { seed: 4, count: n }], &mut dec);
    let t_dec = tiny()
        .decode(
            &mut dec,
            &[DecodeSeq {
                pages: &pages,
                len: n,
                token: text_token(4, u64::from(n), 4096),
            }],
        )
        .unwrap()[0];
    assert_eq!(t_one, t_dec);
    assert_eq!(one, dec);
    // Chunks of 100, 157 (ending past key 256) and 44 rows.
    let mut chunked = tiny().new_kv(20, PT).unwrap();
    let mut cached = 0;
    let mut t_chunked = 0;
    for count in [100, 157, 44] {
        let rows = [Rows::Text { seed: 4, count }];
        t_chunked = prefill_one(&pages, cached, &rows, &mut chunked);
        cached += count;
    }
    assert_eq!(cached, n + 1);
    assert_eq!(t_one, t_chunked);
    assert_eq!(one, chunked);
}

#[test]
fn batched_calls_equal_calls_one_by_one() {
    let img = image(16, 24);
    let (pa, pb) = ([0u32, 1, 2], [3u32, 4]);
    let b_inputs = [Rows::Text {
        seed: 77,
        count: 20,
    }];
    let mut alone = tiny().new_kv(8, PT).unwrap();
    let ta = prefill_one(&pa, 0, &prompt(&img), &mut alone);
    let tb = prefill_one(&pb, 0, &b_inputs, &mut alone);
    let mut batched = tiny().new_kv(8, PT).unwrap();
    let both = tiny()
        .prefill(
            &mut batched,
            &[
                PrefillChunk {
                    pages: &pa,
                    cached: 0,
                    inputs: &prompt(&img),
                },
                PrefillChunk {
                    pages: &pb,
                    cached: 0,
                    inputs: &b_inputs,
                },
            ],
        )
        .unwrap();
    assert_eq!(both, [ta, tb]);
    assert_eq!(alone, batched);
    let step = |kv: &mut KvArena, seqs: &[DecodeSeq<'_>]| tiny().decode(kv, seqs).unwrap();
    let da = step(
        &mut alone,
        &[DecodeSeq {
            pages: &pa,
            len: 37,
            token: ta,
        }],
    );
    let db = step(
        &mut alone,
        &[DecodeSeq {
            pages: &pb,
            len: 20,
            token: tb,
        }],
    );
    let dboth = step(
        &mut batched,
        &[
            DecodeSeq {
                pages: &pa,
                len: 37,
                token: ta,
            },
            DecodeSeq {
                pages: &pb,
                len: 20,
                token: tb,
            },
        ],
    );
    assert_eq!(dboth, [da[0], db[0]]);
    assert_eq!(alone, batched);
}

#[test]
fn copy_pages_copies_real_bytes() {
    let c = tiny();
    let mut kv = c.new_kv(8, PT).unwrap();
    let pages = [0, 1];
    let t = prefill_one(&pages, 0, &[Rows::Text { seed: 2, count: 20 }], &mut kv);
    let mut src = vec![0u8; kv.page_bytes()];
    let mut dst = vec![0u8; kv.page_bytes()];
    kv.read_page(1, &mut dst).unwrap();
    assert!(dst.iter().any(|v| *v != 0));
    kv.read_page(6, &mut dst).unwrap();
    assert!(dst.iter().all(|v| *v == 0));
    // Copy-on-write of the partly filled last page of a fork.
    c.copy_pages(&mut kv, &[1], &[6]).unwrap();
    kv.read_page(1, &mut src).unwrap();
    kv.read_page(6, &mut dst).unwrap();
    assert_eq!(src, dst);
    // The fork (pages [0, 6]) decodes exactly as the parent would.
    let fork = [0, 6];
    let mut parent_kv = kv.clone();
    let d_fork = c
        .decode(
            &mut kv,
            &[DecodeSeq {
                pages: &fork,
                len: 20,
                token: t,
            }],
        )
        .unwrap();
    let d_parent = c
        .decode(
            &mut parent_kv,
            &[DecodeSeq {
                pages: &pages,
                len: 20,
                token: t,
            }],
        )
        .unwrap();
    assert_eq!(d_fork, d_parent);
    assert_eq!(
        kv.read_tokens(&fork, 21).unwrap(),
        parent_kv.read_tokens(&pages, 21).unwrap()
    );
    // And the parent's page 1 is untouched by the fork's append.
    kv.read_page(1, &mut dst).unwrap();
    assert_eq!(src, dst);
    // write_page / read_page round-trip whole pages (moving KV between workers).
    let mut other = c.new_kv(2, PT).unwrap();
    other.write_page(1, &src).unwrap();
    other.read_page(1, &mut dst).unwrap();
    assert_eq!(src, dst);
    // Growing keeps every page's bytes, adds zeroed pages and never shrinks.
    other.grow(5).unwrap();
    assert_eq!(other.pages(), 5);
    other.read_page(1, &mut dst).unwrap();
    assert_eq!(src, dst, "a page kept across the growth");
    other.read_page(4, &mut dst).unwrap();
    assert!(dst.iter().all(|&b| b == 0), "a new page is zeroed");
    other.grow(3).unwrap();
    assert_eq!(other.pages(), 5, "never shrinks");
    other.read_page(1, &mut dst).unwrap();
    assert_eq!(src, dst);
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let c = tiny();
    let mut kv = c.new_kv(4, PT).unwrap();
    let text = [Rows::Text { seed: 1, count: 20 }];
    let chunk = |pages: &'static [u32], inputs| PrefillChunk {
        pages,
        cached: 0,
        inputs,
    };
    // Page table too short, page out of range.
    let err = c.prefill(&mut kv, &[chunk(&[0], &text)]).unwrap_err();
    assert!(
        matches!(err, ComputeError::PageTableTooShort { need: 2, .. }),
        "{err}"
    );
    let err = c.prefill(&mut kv, &[chunk(&[0, 4], &text)]).unwrap_err();
    assert!(
        matches!(err, ComputeError::PageOutOfRange { page: 4, .. }),
        "{err}"
    );
    // Token ids, encoder outputs, empty chunks.
    let bad = [Rows::Tokens(&[1, 4096])];
    let err = c.prefill(&mut kv, &[chunk(&[0], &bad)]).unwrap_err();
    assert!(matches!(
        err,
        ComputeError::TokenOutOfVocab { token: 4096, .. }
    ));
    let odd = vec![0u8; 513];
    let bad = [Rows::Image {
        encoder_output: &odd,
        first: 0,
        count: 1,
    }];
    let err = c.prefill(&mut kv, &[chunk(&[0], &bad)]).unwrap_err();
    assert!(matches!(err, ComputeError::EncoderOutputShape { .. }));
    let two = vec![0u8; 1024];
    let bad = [Rows::Image {
        encoder_output: &two,
        first: 1,
        count: 2,
    }];
    let err = c.prefill(&mut kv, &[chunk(&[0], &bad)]).unwrap_err();
    assert!(matches!(
        err,
        ComputeError::ImageRows {
            end: 3,
            rows: 2,
            ..
        }
    ));
    let err = c.prefill(&mut kv, &[chunk(&[0], &[])]).unwrap_err();
    assert!(matches!(err, ComputeError::EmptyChunk { chunk: 0 }));
    // Decode: a full page table, a bad token.
    let seq = |len, token| DecodeSeq {
        pages: &[0],
        len,
        token,
    };
    assert!(matches!(
        c.decode(&mut kv, &[seq(16, 0)]).unwrap_err(),
        ComputeError::PageTableTooShort { .. }
    ));
    assert!(matches!(
        c.decode(&mut kv, &[seq(3, u32::MAX)]).unwrap_err(),
        ComputeError::TokenOutOfVocab { .. }
    ));
    // Pages: copies, sizes.
    assert!(matches!(
        c.copy_pages(&mut kv, &[0, 1], &[2]).unwrap_err(),
        ComputeError::CopyLengths { src: 2, dst: 1 }
    ));
    assert!(matches!(
        c.copy_pages(&mut kv, &[0], &[9]).unwrap_err(),
        ComputeError::PageOutOfRange { page: 9, .. }
    ));
    assert!(matches!(
        kv.write_page(0, &[0u8; 3]).unwrap_err(),
        ComputeError::PageSize { .. }
    ));
    assert!(kv.read_page(7, &mut vec![0u8; kv.page_bytes()]).is_err());
    assert!(c.new_kv(4, 0).is_err());
    // An arena of another model's layout.
    let mut spec = ModelSpec::by_name("qwen2.5-vl-tiny").unwrap();
    spec.llm.num_hidden_layers = 2;
    let mut other = KvArena::new(&spec, 4, PT).unwrap();
    assert!(matches!(
        c.prefill(&mut other, &[chunk(&[0, 1], &text)]).unwrap_err(),
        ComputeError::ArenaMismatch { .. }
    ));
    // A real checkpoint's spec is refused, not allocated.
    let big = ModelSpec::by_name("qwen2.5-vl-7b").unwrap();
    let err = CpuCompute::new(&big, 0).unwrap_err();
    assert!(matches!(err, ComputeError::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("qwen2.5-vl-tiny"), "{err}");
}

#[test]
fn compute_is_usable_as_a_trait_object_shared_between_threads() {
    let c: &dyn Compute<Kv = KvArena> = tiny();
    let out = std::thread::scope(|s| {
        let h: Vec<_> = (0..2u64)
            .map(|i| {
                s.spawn(move || {
                    c.encode(&[ImageInput {
                        visual_tokens: 4,
                        seed: i,
                    }])
                    .unwrap()
                })
            })
            .collect();
        h.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    });
    assert_eq!(out[0][0], image(4, 0));
    assert_ne!(out[0], out[1]);
}

/// Attention spread over the cores (the CUDA backend's host side) computes the same bits
/// as one head after another: encoder outputs over windows and full blocks, a batched
/// prefill over a cached prefix, and a batched decode.
#[test]
fn parallel_attention_gives_the_same_bits() {
    let spec = ModelSpec::by_name("qwen2.5-vl-tiny").unwrap();
    let par = CpuCompute::new(&spec, 7)
        .unwrap()
        .with_parallel_attention(true);
    let one = tiny();
    let imgs = [
        ImageInput {
            visual_tokens: 256,
            seed: 5,
        },
        ImageInput {
            visual_tokens: 64,
            seed: 6,
        },
    ];
    let enc = one.encode(&imgs).unwrap();
    assert_eq!(par.encode(&imgs).unwrap(), enc);
    let (pa, pb) = (
        [
            0u32, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17,
        ],
        [18u32, 19, 20],
    );
    let first = [Rows::Text { seed: 3, count: 30 }];
    let rest = [Rows::Image {
        encoder_output: &enc[0],
        first: 0,
        count: 256,
    }];
    let b_inputs = [Rows::Text {
        seed: 77,
        count: 40,
    }];
    let mut runs = Vec::new();
    for c in [one, &par] {
        let mut kv = c.new_kv(24, PT).unwrap();
        let t0 = c
            .prefill(
                &mut kv,
                &[PrefillChunk {
                    pages: &pa,
                    cached: 0,
                    inputs: &first,
                }],
            )
            .unwrap();
        let t1 = c
            .prefill(
                &mut kv,
                &[
                    PrefillChunk {
                        pages: &pa,
                        cached: 30,
                        inputs: &rest,
                    },
                    PrefillChunk {
                        pages: &pb,
                        cached: 0,
                        inputs: &b_inputs,
                    },
                ],
            )
            .unwrap();
        let d = c
            .decode(
                &mut kv,
                &[
                    DecodeSeq {
                        pages: &pa,
                        len: 286,
                        token: t1[0],
                    },
                    DecodeSeq {
                        pages: &pb,
                        len: 40,
                        token: t1[1],
                    },
                ],
            )
            .unwrap();
        runs.push((t0, t1, d, kv));
    }
    assert_eq!(runs[0], runs[1]);
}
