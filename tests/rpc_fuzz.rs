//! Fuzzing of the RPC wire format and of a whole server session, with proptest: any bytes a
//! peer sends end in a value or an error, never a panic, a hang or a touch of memory the
//! session did not allocate.
//!
//! Three generators: raw bytes into the packed-sequence decoder; raw packet streams into a
//! session; and valid request streams (allocations, copies, calls, syscalls) with bytes flipped,
//! truncated or spliced, which reach deeper than random bytes do.

use std::io::Cursor;

use kiln::packed_func::{DLDataType, DLDevice, DLDeviceType};
use kiln::rpc::wire::{self, RpcCode, WireTensor, WireValue, Writer};
use kiln::rpc::{Session, SessionLimits};
use proptest::prelude::*;

const CPU: DLDevice = DLDevice {
    device_type: DLDeviceType::CPU,
    device_id: 0,
};

fn init_packet() -> Vec<u8> {
    let mut p = Writer::packet(RpcCode::InitServer);
    p.blob(b"0.8.0");
    p.seq(&[]);
    p.finish()
}

fn run_session(input: Vec<u8>) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let mut out = Vec::new();
    {
        let mut s = Session::new(
            Cursor::new(input),
            &mut out,
            dir.path().to_path_buf(),
            SessionLimits {
                max_packet_bytes: 1 << 20,
            },
        );
        let _ = s.run();
    }
    out
}

fn syscall(code: RpcCode, args: &[WireValue]) -> Vec<u8> {
    let mut p = Writer::packet(code);
    p.seq(args);
    p.finish()
}

/// A valid request stream: the handle values the server gives out are predictable (0x1000
/// upwards), the allocations' are not, so tensors carry a guess that the fuzzer mutates.
fn valid_requests(seed: u64) -> Vec<u8> {
    let u8t = DLDataType::parse("uint8").unwrap();
    let f32t = DLDataType::parse("float32").unwrap();
    let t = WireTensor {
        data: 0x1000 + seed % 4096,
        device: CPU,
        dtype: f32t,
        shape: vec![4, 4],
        byte_offset: seed % 64,
    };
    let mut s = init_packet();
    s.extend(syscall(
        RpcCode::DevAllocData,
        &[
            WireValue::Device(CPU),
            WireValue::Int(256),
            WireValue::Int(64),
            WireValue::DataType(u8t),
        ],
    ));
    s.extend(syscall(
        RpcCode::GetGlobalFunc,
        &[WireValue::Str("tvm.contrib.random.random_fill".into())],
    ));
    let mut p = Writer::packet(RpcCode::CallFunc);
    p.u64(0x1000);
    p.seq(&[WireValue::Tensor(t.clone())]);
    s.extend(p.finish());
    let mut p = Writer::packet(RpcCode::CopyToRemote);
    p.tensor(&t);
    p.u64(64);
    p.raw(&[3u8; 64]);
    s.extend(p.finish());
    let mut p = Writer::packet(RpcCode::CopyFromRemote);
    p.tensor(&t);
    p.u64(64);
    s.extend(p.finish());
    s.extend(syscall(
        RpcCode::GetGlobalFunc,
        &[WireValue::Str("tvm.rpc.server.upload".into())],
    ));
    let mut p = Writer::packet(RpcCode::CallFunc);
    p.u64(0x1001);
    p.seq(&[
        WireValue::Str("a.bin".into()),
        WireValue::Bytes(vec![1, 2, 3]),
    ]);
    s.extend(p.finish());
    s.extend(syscall(
        RpcCode::CopyAmongRemote,
        &[
            WireValue::Tensor(t.clone()),
            WireValue::Tensor(t),
            WireValue::Handle(0),
        ],
    ));
    s.extend(syscall(
        RpcCode::DevGetAttr,
        &[WireValue::Device(CPU), WireValue::Int(1)],
    ));
    s.extend(syscall(RpcCode::FreeHandle, &[WireValue::Handle(0x1000)]));
    s.extend(Writer::packet(RpcCode::Shutdown).finish());
    s
}

fn any_value() -> impl Strategy<Value = WireValue> {
    prop_oneof![
        Just(WireValue::None),
        any::<i64>().prop_map(WireValue::Int),
        any::<f64>().prop_map(WireValue::Float),
        any::<u64>().prop_map(WireValue::Handle),
        ".{0,12}".prop_map(WireValue::Str),
        proptest::collection::vec(any::<u8>(), 0..16).prop_map(WireValue::Bytes),
        (
            any::<u64>(),
            proptest::collection::vec(-2i64..9, 0..4),
            any::<u64>()
        )
            .prop_map(|(data, shape, off)| WireValue::Tensor(WireTensor {
                data,
                device: CPU,
                dtype: DLDataType::parse("float32").unwrap(),
                shape,
                byte_offset: off,
            })),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    #[test]
    fn decoder_takes_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = wire::decode_seq(&bytes);
        let mut r = wire::Reader::new(&bytes);
        let _ = r.tensor("t");
    }

    #[test]
    fn tar_reader_takes_any_bytes(mut bytes in proptest::collection::vec(any::<u8>(), 0..2048),
                                  ustar in any::<bool>()) {
        // Half the inputs get a plausible header so the member paths are reached.
        if ustar && bytes.len() >= 512 {
            bytes[..6].copy_from_slice(b"lib0.o");
            bytes[6..100].fill(0);
            bytes[124..135].copy_from_slice(b"00000000100");
            bytes[135] = 0;
        }
        if let Ok(members) = kiln::rpc::link::tar_members(&bytes) {
            for (name, data) in members {
                prop_assert!(!name.contains('/') && name != ".." && !name.is_empty());
                prop_assert!(data.len() <= bytes.len());
            }
        }
        let _ = kiln::rpc::link::maybe_gunzip(&bytes, 1 << 20);
    }

    #[test]
    fn encoded_values_decode_to_themselves(v in proptest::collection::vec(any_value(), 0..6)) {
        let mut w = Writer::packet(RpcCode::Return);
        w.seq(&v);
        let p = w.finish();
        let back = wire::decode_seq(&p[12..]).unwrap();
        // NaN != NaN: compare the encodings.
        let mut w2 = Writer::packet(RpcCode::Return);
        w2.seq(&back);
        prop_assert_eq!(w2.finish(), p);
    }

    #[test]
    fn session_takes_any_stream(tail in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut input = init_packet();
        input.extend(tail);
        run_session(input);
    }

    #[test]
    fn session_takes_mutated_requests(
        seed in any::<u64>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut input = valid_requests(seed);
        let n = input.len();
        for (i, b) in flips {
            let i = i.index(n);
            // Keep InitServer intact half the time so the deeper paths are reached.
            if i >= 24 || seed % 2 == 0 {
                input[i] ^= b;
            }
        }
        if truncate {
            input.truncate(cut.index(n + 1));
        }
        run_session(input);
    }
}

#[test]
fn valid_requests_are_served() {
    // The unmutated stream is valid up to the guessed tensors: every packet is answered.
    let out = run_session(valid_requests(0));
    let mut r = wire::Reader::new(&out);
    let mut codes = Vec::new();
    while r.remaining() > 0 {
        let len = r.u64("len").unwrap();
        let body = r.bytes(len, "body").unwrap();
        codes.push(i32::from_le_bytes(body[..4].try_into().unwrap()));
    }
    // InitServer, alloc, get, call, copy-to, copy-from, get, upload, copy-among, attr, free.
    assert_eq!(codes.len(), 11, "{codes:?}");
    assert_eq!(codes[0], RpcCode::Return as i32);
}
