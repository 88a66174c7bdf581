//! `FaultyStore`: deterministic schedules, faults only where they apply, exact accounting.

use moonagent_core::faulty::{FaultKind, FaultRates, FaultyStore, Op};
use moonagent_core::fingerprint::{GridThw, ImageFp, ModelParts};
use moonagent_core::mm_cache::{
    blob_key, meta_key, Checksum, ChecksumAlgo, Envelope, EnvelopeError, ModelCtx,
};
use moonagent_core::store::{
    DataType, MemStore, MemStoreConfig, Payload, ReplicateConfig, Store, StoreError,
};

const FP: ImageFp = ImageFp([9; 32]);

fn mem() -> MemStore<String> {
    MemStore::new(MemStoreConfig::with_capacity(1 << 20)).expect("valid config")
}

fn cfg() -> ReplicateConfig {
    ReplicateConfig::of(DataType::EncoderOutput)
}

fn meta_bytes() -> Vec<u8> {
    let ctx = ModelCtx::new(ModelParts::example("alice"), 4).expect("ctx");
    let exp = ctx.expect(GridThw::new(1, 2, 2)).expect("grid");
    exp.envelope(FP, Some(Checksum::of(ChecksumAlgo::Xxh3_64, &[0; 8])))
        .encode()
        .expect("encode")
}

fn read(s: &mut impl Store, key: &str) -> Result<Vec<u8>, StoreError> {
    let mut buf = vec![0u8; 1 << 14];
    let n = s.get_into(0, key, &mut buf)?;
    buf.truncate(n as usize);
    Ok(buf)
}

/// A fixed mixed workload; returns every result as text.
fn workload(s: &mut impl Store) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..200u64 {
        let fp = ImageFp([i as u8 % 7; 32]);
        let (mk, bk) = (meta_key(&fp), blob_key(&fp));
        out.push(format!(
            "{:?}",
            s.put(i, &bk, Payload::Bytes(vec![i as u8; 64]), &cfg())
        ));
        out.push(format!(
            "{:?}",
            s.put(i, &mk, Payload::Bytes(meta_bytes()), &cfg())
        ));
        out.push(format!("{:?}", read(s, &mk).map(|b| b.len())));
        out.push(format!("{:?}", read(s, &bk)));
        out.push(format!("{:?}", s.get_size(i, &bk)));
        let held = s.begin_read(i, &bk);
        out.push(format!("{held:?}"));
        if held.is_ok() {
            out.push(format!("{:?}", s.end_read(i, &bk)));
        }
        out.push(format!("{:?}", s.exists(i, "other")));
        if i % 3 == 0 {
            out.push(format!("{:?}", s.remove(i, &mk, true)));
            out.push(format!("{:?}", s.remove(i, &bk, true)));
        }
    }
    out
}

#[test]
fn same_seed_gives_the_same_faults_and_results() {
    let rates = FaultRates::uniform(0.05);
    let mut a = FaultyStore::new(mem(), 42).with_rates(rates).with_log(true);
    let mut b = FaultyStore::new(mem(), 42).with_rates(rates).with_log(true);
    let mut c = FaultyStore::new(mem(), 43).with_rates(rates).with_log(true);
    assert_eq!(workload(&mut a), workload(&mut b));
    assert_eq!(a.log(), b.log());
    assert_eq!(a.injected_all(), b.injected_all());
    workload(&mut c);
    assert_ne!(a.log(), c.log());
    assert!(a.injected_all().iter().sum::<u64>() > 0);
    assert_eq!(a.log().len() as u64, a.injected_all().iter().sum::<u64>());
}

#[test]
fn zero_rates_pass_everything_through() {
    let mut f = FaultyStore::new(mem(), 1);
    let mut m = mem();
    assert_eq!(workload(&mut f), workload(&mut m));
    assert_eq!(f.injected_all(), [0; FaultKind::COUNT]);
}

#[test]
fn each_fault_strikes_only_operations_it_applies_to() {
    for kind in FaultKind::ALL {
        let mut f = FaultyStore::new(mem(), 5).with_log(true);
        f.set_rate(kind, 1.0);
        workload(&mut f);
        assert!(f.injected(kind) > 0, "{kind:?} never applied");
        for inj in f.log() {
            assert_eq!(inj.kind, kind);
            let meta = inj.key.starts_with("mc:mmmeta:");
            let blob = inj.key.starts_with("mc:mmblob:");
            let ok = match kind {
                FaultKind::DropMeta
                | FaultKind::CorruptMeta
                | FaultKind::StaleSchema
                | FaultKind::SwapTenant => meta && inj.op == Op::Put,
                FaultKind::DropBlob | FaultKind::CorruptBlob | FaultKind::TruncateBlob => {
                    blob && inj.op == Op::Put
                }
                FaultKind::LeaseExpired => matches!(inj.op, Op::GetInto | Op::GetSize),
                FaultKind::BufferRegistration => inj.op == Op::GetInto,
                FaultKind::HoldRefused => inj.op == Op::BeginRead,
                FaultKind::Unavailable => true,
            };
            assert!(ok, "{kind:?} struck {:?} on {}", inj.op, inj.key);
        }
    }
}

#[test]
fn data_faults_store_what_they_say() {
    let (mk, bk) = (meta_key(&FP), blob_key(&FP));
    let blob = vec![7u8; 64];
    let put = |kind: FaultKind| {
        let mut f = FaultyStore::new(mem(), 9);
        f.push_fault(kind);
        f.put(0, &bk, Payload::Bytes(blob.clone()), &cfg())
            .expect("blob put reports ok");
        f.put(0, &mk, Payload::Bytes(meta_bytes()), &cfg())
            .expect("meta put reports ok");
        assert_eq!(f.injected(kind), 1, "{kind:?}");
        f
    };
    let mut f = put(FaultKind::DropMeta);
    assert_eq!(read(&mut f, &mk), Err(StoreError::NotFound));
    let mut f = put(FaultKind::DropBlob);
    assert_eq!(read(&mut f, &bk), Err(StoreError::NotFound));
    let mut f = put(FaultKind::CorruptBlob);
    let got = read(&mut f, &bk).expect("blob");
    assert_eq!(got.len(), blob.len());
    assert_eq!(got.iter().zip(&blob).filter(|(a, b)| a != b).count(), 1);
    let mut f = put(FaultKind::TruncateBlob);
    assert!(read(&mut f, &bk).expect("blob").len() < blob.len());
    let mut f = put(FaultKind::CorruptMeta);
    assert!(Envelope::decode(&read(&mut f, &mk).expect("meta")).is_err());
    let mut f = put(FaultKind::StaleSchema);
    assert!(matches!(
        Envelope::decode(&read(&mut f, &mk).expect("meta")),
        Err(EnvelopeError::SchemaMismatch { .. })
    ));
    let mut f = put(FaultKind::SwapTenant);
    let env = Envelope::decode(&read(&mut f, &mk).expect("meta")).expect("well-formed");
    assert_eq!(env.tenant, "mallory");
}

#[test]
fn read_faults_are_transient_and_client_faults_are_client_failures() {
    let bk = blob_key(&FP);
    let mut f = FaultyStore::new(mem(), 2);
    f.put(0, &bk, Payload::Bytes(vec![1; 16]), &cfg())
        .expect("put");
    f.push_fault(FaultKind::LeaseExpired);
    assert_eq!(read(&mut f, &bk), Err(StoreError::LeaseExpired));
    assert_eq!(read(&mut f, &bk), Ok(vec![1; 16]));
    f.push_fault(FaultKind::BufferRegistration);
    let e = read(&mut f, &bk).expect_err("fault");
    assert!(e.is_client_failure());
    f.push_fault(FaultKind::Unavailable);
    let e = f.exists(0, &bk).expect_err("fault");
    assert!(e.is_client_failure());
    // A lease fault needs an object to read: on a missing key it waits in the queue.
    f.push_fault(FaultKind::LeaseExpired);
    assert_eq!(read(&mut f, "missing"), Err(StoreError::NotFound));
    assert_eq!(f.queued(), 1);
    assert_eq!(read(&mut f, &bk), Err(StoreError::LeaseExpired));
    assert_eq!(f.injected(FaultKind::LeaseExpired), 2);
}

#[test]
fn put_start_and_put_end_see_the_same_faults() {
    let bk = blob_key(&FP);
    let mut f = FaultyStore::new(mem(), 4);
    f.push_fault(FaultKind::TruncateBlob);
    f.put_start(0, &bk, 32, &cfg()).expect("start");
    f.put_end(0, &bk, Payload::Bytes(vec![3; 32])).expect("end");
    assert!(read(&mut f, &bk).expect("blob").len() < 32);
    f.remove(0, &bk, true).expect("remove");
    f.push_fault(FaultKind::DropBlob);
    f.put_start(0, &bk, 32, &cfg()).expect("start");
    f.put_end(0, &bk, Payload::Bytes(vec![3; 32])).expect("end");
    assert_eq!(read(&mut f, &bk), Err(StoreError::NotFound));
    assert!(
        f.inner().is_empty(),
        "dropped put must not leave a reservation"
    );
}

/// A refused hold grants the read's lease and holds nothing: once the lease has run out
/// the object can be removed, where a held read keeps it until the read is closed.
#[test]
fn a_refused_hold_leaves_only_the_lease() {
    let ttl = MemStoreConfig::with_capacity(1 << 20).kv_lease_ttl_ns;
    let key = blob_key(&FP);
    for refused in [false, true] {
        let mut f = FaultyStore::new(mem(), 3).with_log(true);
        f.put(0, &key, Payload::Bytes(vec![1; 64]), &cfg())
            .expect("put");
        if refused {
            f.push_fault(FaultKind::HoldRefused);
        }
        let r = f.begin_read(10, &key);
        assert_eq!(r.is_err(), refused, "{r:?}");
        assert_eq!(f.injected(FaultKind::HoldRefused), u64::from(refused));
        // Within the lease nothing may remove it either way.
        assert_eq!(f.remove(ttl, &key, false), Err(StoreError::HasLease));
        let after = f.remove(ttl + 11, &key, false);
        if refused {
            assert_eq!(after, Ok(()));
            assert_eq!(f.log()[0].op, Op::BeginRead);
        } else {
            assert_eq!(after, Err(StoreError::HasLease));
            f.end_read(ttl + 12, &key).expect("close the read");
            assert_eq!(f.remove(ttl + 13, &key, false), Ok(()));
        }
    }
    // A refusal of a key that is not there is the store's own answer, and the queued fault
    // waits for a read it can strike.
    let mut f = FaultyStore::new(mem(), 3);
    f.push_fault(FaultKind::HoldRefused);
    assert_eq!(f.begin_read(0, "absent"), Err(StoreError::NotFound));
    assert_eq!(f.queued(), 1);
}
