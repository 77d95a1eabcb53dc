//! Tests of whole ULPDUs (RFC 5040 §4, RFC 7306): golden bytes per opcode, the T flag,
//! QN and segmentation checks, siw captures and round trips of every opcode.

use super::*;
use crate::ddp::DdpError;
use crate::rdmap::test_util::*;
use crate::rdmap::{FIELD_QN, RemoteOperationError, TerminateCode, classify, terminate_code_for};
use crate::vectors::rdmap_ulpdus::*;
use proptest::prelude::*;

// ---- Real traffic: whole ULPDUs cut from ../shared/captures (MPA length,
// ---- PAD and CRC stripped; see captures/INDEX.md). The ones other files' tests
// ---- use too are in `crate::vectors::rdmap_ulpdus`.

/// siw-rping.pcap frame 11: Send (rping's buffer advertisement), whole ULPDU.
const SIW_RPING_SEND: [u8; 34] = [
    0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x56, 0x39, 0x90, 0xb5, 0x03, 0x70, 0x51, 0xa1, 0x6c, 0x00, 0x00, 0x00,
    0x00, 0x40,
];
/// siw-send_inv.pcap frame 11: Send with Invalidate, whole ULPDU.
const SIW_SEND_INV: [u8; 82] = [
    0x41, 0x44, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00,
    0x00, 0x00, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61,
    0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61,
    0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61,
    0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61,
    0x61, 0x61,
];
/// siw-ib_read_bw.pcap frame 61: last segment of the Read Response to frame 39, whole ULPDU (1254 octets).
const SIW_READ_BW_READ_RESPONSE_LAST: &str = "\
    c1421e445300000055acbf911b280e1af2ab690966ebeeb6aaf51876711f6e9530093d829a443e9a5f5d5236036050f5\
    0cb9ff72a4ed294ee241c4536132e9913b2613d66a5170c9afc2ffb2234fa82f08a7a1ac94cafa760cbfc96df1b2fe2d\
    d812034263730b12360ac559596d886114290da8f4081e00c7e76db89a6be5727de8b5e15cc0f392cbb8eb2425738639\
    9c93e1909bff9062e7fd1b816900f3e6e9a8c74569bbd73473c2589935ded2d172b4620db3f2709af08b1b598b0f3f74\
    b707b920c290543552adce878ba159fd55bb0b08ad7ba39d06bef691cd3606853dbfa5ff50fa34a2a7032a32a48330f9\
    3e3b01ebb6a489bc637f4d30b553b5f2135bf163552605fc292f2ecdb25ec6f099c7dc4f6c650bcfe459ff9aacb58cbf\
    107e2265a42861cd578f9a0aee60fa8727d6d7933be262203b62bae81746a727c4ca8c68f2ed35497ccf536a2f4ef257\
    24c9ea60ab4d80e7af3acfc68076ed454079ad3266e37ce2b2cf4de21d3f39420823a2b370229a1f5c69e5dce0d22120\
    4bcf53b1b2cf94649ee146bc207ffe28a3a0db13c276331edf18fabfeb1ce036eb33e89d027c01a05d485c7dc75aa56a\
    fa807ebcf6b1dad6c9d595b4f175ebdca8d379aa4f7a4bacc2a7298a02cef4fc4e72b94523931bed68b0a159268c35ce\
    5fae79ae29c45aeb6b83756d516a6aa0dc23e500b600ed1fb08e78d61baea57a5c1e2985e283714d07e6bb585025f82d\
    48dd2dfedd1a1d8ea89664c344093ea027672609ea9757f17d124ace3742fb7f20287dfd429b8bea31f0ae75f9ec1521\
    533b2a3dd2812f5093791ecabb1949db41c7d98362646d93541b084e071d6f5a5999982b1bc77bae409979fbb2c2d7f3\
    89b076eb14e47e69ff86b707a42661fdbff928dac0a489003d02fcf0c4d3e34e835a39973eb8003d3eb744e2dda6df9d\
    9f087760ac0060e9025cd9c72fbd15b2174e4a55064a924502d727df7d077c1c0ff47cbbf4dda4f7397ebe693bd31b52\
    2165a728b0396db21094918d9b0eaaaa022665f6030aed3d88aba6c37ec115a027bcc8d7f5358906c91a9365283d0f2a\
    647521677f0ea407ba4aca380cdfd8339ba00a90d593969fad2a04d6671300cb8821330730d70eea22d8222eb7fb6152\
    9b6be371fe7910aba314810b2782d6b0a309b7d3e1c6bd039ee03156db92a876fd8be7fb05f7a6a80b28b333aa8ae34d\
    939a217460de77ffbea855993afd103789f7328eefd936fa01ea2dab7410f807ab197c0bf8f30ab69c5f50d65d600ee6\
    5740744619aa411a946ec5087fbe102ad78c35cf7f40861b9fd6f2fc3600e28d4056d45a01157495833a9e02f8ae2ccf\
    3a629fb9a225d541fbc73e31c720be0777926178a7d60d2b10ab2d08595ad793bc764d5e9b229f96e9ddc7b0fe86b775\
    1819edc0effaebffa61807ff72de932e55e08cf0022c87eb094e9b07d4527ced6b69ad5a6498590ab06009233f9c5194\
    7cde847e0a0b69135a041b2e57971bc201c81d6560766f11d77834161585aa91632e106d3a7981947e9cc2d533de9734\
    a6b499072b081802814c1896d1c22735f037a22ab123be2fbf8104f35f9b270550c10c7bc9247d4a7095e04257087747\
    3f1972f03d301ffcb123ef10bf17160fd8228aa14707ecb79cccf9f3d4703a148aac04c7dd24c38e47b39f06cab515a2\
    d79f431ea62fd642fccf35d04070e4ca1ce991f90d54885407275bd1dc7073b310b7d2b6e6a8f9e2772eb3b79e9781bb\
    8012b48d673c\
";
/// siw-ib_write_bw.pcap frame 44: last segment of a 4096-octet RDMA Write, whole ULPDU (1254 octets).
const SIW_WRITE_BW_WRITE_LAST: &str = "\
    c1400a786c00000055b317baab28e13d48c4b0f51d03c7f6be5994a99b05156b8f24418d720369b314aa6a251f4b6368\
    0f135d2c162423d47db77d18bc93844bb7c5d92ac842dddcec47020c926574a178d1ce8ef6f16373a8e08c647310b02b\
    d589559dcb327ab7797cc30be137ac59097ae7ff6b4a72132bfe789e0e28c9e3b11e817c50fb33c977f7d4582e81b137\
    fb983667e3a97a0ea7f2acb61a7699cb941a47e5157bae8c7283e4a00495d8ff2e0e6611b7e11f5fd3cb15ee41aeb9d6\
    c901bbde7c696beeec4f8ef0e566f0137556242c37438b0b0ea0f9504fb22618b3e1f62f4a611d37b1ac27961217a987\
    6ecdb4a5103fb01ee0a96e2f5c94470f753d3fc09f5cf750081ee61b368fa2a45c56496c96fa8a76a3f9a5ff8dec0f03\
    294ec3c8aaba18b3d8fece0e8d70b2e9c7fc555df6e0d399d978996664a8698df62c56a0e66e53bf6d21cdfa9280e459\
    7c39b67219890bf201a459654cc2f242ef48e3d5b736942458621eeae202435e3cf9d05582db488380a1e8cc63da0f52\
    23f228da28bcfe801e1c6a001fad5e5ba62eb0280af8ab8a999356fd6e654f9157776b8034690052856b53a418b1ffbf\
    e0b0e7eaa893744226ca3f94308e25870690073af9088c7f73df238b91234a71d3325b7bc5cfbdeb99fc80c98ba55191\
    3658cb2f6057aed337d25fc8f5a939c8db9443a063018cfcfd0cc688b11719e76fe417d03cc5a37397023b8cac745487\
    0898286b99b46796c02d1f71443859b41d7084593527cccd2a0759d67bae5d834685eedf395575f983946bc7cdc47bea\
    34ff4369270f3651169027913e8414840a02634357d83dda6da8a23a6c1d24a01d6709447640958cd0bc1d0e4031924a\
    33f58e8acdcb653a730774df24987f41ff888575c81a0198d61ea6174f3861822def0dfbba72352d79aa0c9d428bdf42\
    1464b7dc7fb97555d71b6c2754cea981bdb67c7828b2a5a15cb23f9e3d1ee05182982e0151a35728bec34f1291f9944f\
    af10c7d8c26c791e1eb8bd5cd69dad5935db5a867eb1af3d75fe4f06f7e355a7f41c7fb689f8d5a7b19203872fb1e065\
    8c3beb0bec9a4861999768907bbd376fdab62563affa0a608c0ee7bcbfc8214b030c56efa79e514036b9d0b176082050\
    be45b36d40becdccccb5888b7da9d680b62d6f5dcbc09d01796db2f075d2403418f4a158b26f247e24ad09a156df210c\
    0c9069d85106d9ca748cbae95efb1d76efbfcea12ef31f52a028f3f607140314a46cecf573c5c0e7517ad0b075ee2664\
    adf505dbe8242d884c207e54348168d8ee54ce61198e486b08181b7e0641e2b336e88e1e0cbba659db25ad0fa615e894\
    69b6f582443ded4c5608ca5c4aad1080959e9fa15a45fa356aa74511bc2da525e39ba827d895732e9e3e8be8eb9b6880\
    390721934d1cc9b7c30ec8803b6ea51e094d45e1e3b81081f69b69e136d1616fd98303269fccdd62daa6e2151488331d\
    d578feb8300e3927a9a208df746a4f4ded52738c1e50eef8f6d10d0a5940272eb826e7e834200fdec318bd37820c846f\
    5ef7fb7c47e9743eba814813c1704279962962ca4971a80c8966430b72c77ad1be754d065fc24419438c2d05fc6f7e92\
    98e05de15205eedb6b31e7def961afb7d7fcbd36be014f028e7c078aeb851d83667a65b87f5393eb847ac97ddc7835b3\
    74f2e933f4383582b53c0ca0c1292427a389df23dc730e60edd7dec94f137cc30565f6f99e2b7b536788f329b1175055\
    a030787ca386\
";
/// siw-ib_send_bw.pcap frame 45: last segment (MSN 1, MO 2848) of a 4096-octet Send, whole ULPDU (1266 octets).
const SIW_SEND_BW_SEND_LAST: &str = "\
    414300000000000000000000000100000b20b150b07b71d9fdaec46f0e15b9ead72a6327a7dea25fc5d03e02976cdcaa\
    7a8dfa2b086b040519c87527dd2e12b45875dbff547e5f194e9d1ce50af88f848589af8ef5b3930e7b08365836480d8f\
    bde88e1166ed2bb48b479a953f2919c4b3c952a87ce6b6f8eeec5025345db4f2464203ac302e61bb75fb50b4246979d7\
    32cb7fafb136a7a022f7c5575579499bbb4c47eb7ba8a6f0a3f6a5c8601e9f92e91f419b55e83b77e000ce357917d034\
    641720dfc0c6cf63bd742b1d92cbaf7ceaf1173fd952b6b95285eecb9cbeff00d61fdf96e6aff9a32325c0b6f06f32da\
    6049193a9bcff3ed54e2b8f1a0b7f176d7d10cbd800660a32b20591b8f8bf5f0d40e2a6fdd1d5c32ff1423a0cc1416a3\
    e523606529c00954e0626f6fee645fc27289324fa78e81a6a3a4466fb95d129e807204a9320dfd126f6c815dd0e12042\
    6a529111e013b883b7fef2705b040fdb761384a82081ba8fed3cedbd1d0dff875f91993fa451c35b4fb5ccabbadb8630\
    ee0bd90e8c939d7acf8a37ec973774f6c80d366c5ef9c7adae9358686edf995cea726a760508f0d59228c12a5f352027\
    425693a04f5a4efeeea6665c85ffb96f7123e6772bd64cbefe0de85d430884855f1726ae7274ac601a13bca012750f84\
    99f5fbc4cc4782ca546a289773ac1dd2c4438036b72d96d140527152c881d66176d1254218a80d6d12350485e12157a5\
    64d8db1b0571ed45c45e978cdf6eed563f129858baa5c5cddac952bcebaa614f823d6b87ae58cc72b663fe96d1ebec11\
    fe8469b82a2e8504f7d8c0e2822232045f9d8b0df55780abba7e418c6a2d9d68b20620dc34a6e02b7ea10e00c3400422\
    dd8f2fd2e6af7da02ebf2c98ecc9009ecf207a03c65b2f44fc3d44bf7d48e15ad7102cbdc0a95eee688a86555486f323\
    a66e276dc956b1c593f684103e656a167596d3353f3123a8bca9fd102ff033d65e5a4327b0f4ec43ea705329d5bd3f4b\
    5312809344a43b004d38107d284353879e96ae4e8a9b92750be59ee1a3dd2cf6efac893350c4339efc431b25876eac25\
    045a738ef5050301eba1e28e7e0e846eba0ea10bd2d5a9cf18c4f49f32a0c436fa38c4f03dc8f12869d3b6e8e13b569b\
    49f7a61bcc4feae513de84457e497b79814069be085ae7712d9d590ed8afa921a7503d739f2758b306ddf8842674fda7\
    b46665bcc04c2dedea87fbc236a5e4ddf521519448a9474e8640d3acb4d0536837b924f70551e5efd8e0b20f8596ec7a\
    b73d0fffe7564e6d96211a4af16db22826d6202c28051b00e5cd0f6b63fce51a39f41a204b688ee189a82c7a15dea33c\
    b5c368ddc883ddad51ed18b4e9fecf22f2e9433d51d11fda794b548e29f7cadeba32bb82b69930078648bb6f468a9139\
    73d476c4a5959e1ee0f3ad0aea77e8a5aaa427603d5767c3a02232e6adc31f209896e53d2b835c0c7609166180fe062a\
    a22d8adf85f1a22514d40bc1982be130c1c66dec4ac9f8c0d20e21530d277daf55088fdaf931ff0d060ace9e35b0cef6\
    763be3c005db81d7eaa22af7caa8a61fb035f9a967f8b76d02850b3835d92eac14116c19ededf1d7901bce5ac3747973\
    aa721d116ad47e6c5989a48f62d33b76e4a790d19581a8259c767f60ebf8d3956af0a6d4c424401eade5ad0fb8e8859c\
    8f156e24961649338dc89378c0660d2a57b3fe1bd73f398424e693dcce18785e2ee682c4fdccf78a948a0255f10f7f48\
    c27e6399bd9d1de183b0bd52c835b0f61c32\
";

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2));
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// RDMAP-14, EXT-DDP-01, EXT-DDP-02: the seed MPA Fig. 5 ULPDU is a Send
/// (control octet 0x43: RV 1, Rsv 0, OpCode 3) on QN 0, MSN 1, MO 0.
#[test]
fn rdmap_14_seed_mpa_fig5_send() {
    let seg = round_trip(&SEED_FIG5_ULPDU);
    assert_eq!(
        seg.control,
        Control {
            rv: 1,
            rsv: 0,
            opcode: Opcode::Send
        }
    );
    assert_eq!(seg.ddp, untagged(Opcode::Send, 0, 1, 0, true));
    assert_eq!(seg.body, Body::Send { payload: &[0; 24] });
    golden(
        &SEED_FIG5_ULPDU,
        Segment::new(
            untagged(Opcode::Send, 0, 1, 0, true),
            Body::Send { payload: &[0; 24] },
        ),
    );
}

/// RDMAP-35, EXT-DDP-03: RDMA Write golden bytes (tagged, T=1).
#[test]
fn rdmap_35_write_golden() {
    let bytes = [
        0xc1, 0x40, 0x11, 0x22, 0x33, 0x44, 0, 0, 0, 0, 0, 0, 0x10, 0x00, b'a', b'b', b'c',
    ];
    golden(
        &bytes,
        Segment::new(
            tagged(Opcode::RdmaWrite, 0x1122_3344, 0x1000, true),
            Body::RdmaWrite { payload: b"abc" },
        ),
    );
    // RDMAP-40: a zero-length Write is one segment with L=1.
    golden(
        &bytes[..14],
        Segment::new(
            tagged(Opcode::RdmaWrite, 0x1122_3344, 0x1000, true),
            Body::RdmaWrite { payload: &[] },
        ),
    );
}

/// RDMAP-51, RDMAP-24: Read Response golden bytes (T=1, STag/TO of the request's sink).
#[test]
fn rdmap_51_read_response_golden() {
    let rr = read_request_1();
    let bytes = [
        0xc1, 0x42, 0x11, 0x22, 0x33, 0x44, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x10, 0x00, 7,
    ];
    golden(
        &bytes,
        Segment::new(
            tagged(Opcode::RdmaReadResponse, rr.sink_stag, rr.sink_to, true),
            Body::RdmaReadResponse { payload: &[7] },
        ),
    );
}

/// RDMAP-58: Send and Send with SE golden bytes (T=0, QN 0, Invalidate field 0).
#[test]
fn rdmap_58_send_and_send_se_golden() {
    for (op, octet) in [(Opcode::Send, 0x43), (Opcode::SendWithSe, 0x45)] {
        let bytes = [
            0x41, octet, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, b'x', b'y',
        ];
        let body = if op == Opcode::Send {
            Body::Send { payload: b"xy" }
        } else {
            Body::SendWithSe { payload: b"xy" }
        };
        golden(&bytes, Segment::new(untagged(op, 0, 9, 0, true), body));
    }
}

/// RDMAP-15, RDMAP-66: Send with Invalidate and Send with SE and
/// Invalidate carry the STag in RsvdULP octets 1..5.
#[test]
fn rdmap_15_66_send_invalidate_golden() {
    for (op, octet) in [
        (Opcode::SendWithInvalidate, 0x44),
        (Opcode::SendWithSeAndInvalidate, 0x46),
    ] {
        let bytes = [
            0x01, octet, 0xca, 0xfe, 0xba, 0xbe, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0x05, 0x90, 1,
        ];
        let body = if op == Opcode::SendWithInvalidate {
            Body::SendWithInvalidate {
                invalidate_stag: 0xcafe_babe,
                payload: &[1],
            }
        } else {
            Body::SendWithSeAndInvalidate {
                invalidate_stag: 0xcafe_babe,
                payload: &[1],
            }
        };
        let seg = Segment::parse(&bytes).unwrap();
        assert_eq!(seg.body, body);
        assert_eq!(seg.body.invalidate_stag(), Some(0xcafe_babe));
        // Built without the STag in the DDP header: emit puts it there.
        assert_eq!(
            emit_vec(&Segment::new(untagged(op, 0, 2, 0x590, false), body)),
            bytes
        );
    }
}

/// RDMAP-21: garbage in the Invalidate STag field of Send, Read Request
/// and Terminate is accepted, ignored and re-emitted.
#[test]
fn rdmap_21_invalidate_field_garbage_kept() {
    let mut ulpdu = SEED_FIG5_ULPDU;
    ulpdu[2..6].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
    let seg = round_trip(&ulpdu);
    assert_eq!(seg.body.invalidate_stag(), None);
    assert_eq!(seg.ddp.rsvd_ulp(), &[0x43, 0xde, 0xad, 0xbe, 0xef]);
    let mut rr = SIW_READ_BW_READ_REQUEST;
    rr[2..6].copy_from_slice(&[1, 2, 3, 4]);
    round_trip(&rr);
}

/// RDMAP-104, RDMAP-16: T flag not as Figure 4 says → Unexpected OpCode.
#[test]
fn rdmap_104_tagged_flag_mismatch() {
    let mut send_tagged = SEED_FIG5_ULPDU;
    send_tagged[0] = 0xc1;
    let mut write_untagged = hex(SIW_WRITE_BW_WRITE_LAST);
    write_untagged[0] = 0x41;
    for bytes in [&send_tagged[..], &write_untagged[..]] {
        let err = Segment::parse(bytes).unwrap_err();
        assert_eq!(classify(&err), Some(Violation::TaggedFlagMismatch));
        assert_eq!(
            terminate_code_for(&err),
            Some(TerminateCode::RdmaRemoteOperation(
                RemoteOperationError::UnexpectedOpcode
            ))
        );
    }
    // emit refuses what parse refuses.
    let seg = Segment::new(
        tagged(Opcode::Send, 1, 2, true),
        Body::Send { payload: &[] },
    );
    assert_eq!(
        seg.emit(&mut [0; 64]),
        Err(Violation::TaggedFlagMismatch.error())
    );
}

/// RDMAP-104 (ambiguity 10) and EXT-DDP-05: a QN of another RDMAP queue
/// is an Unexpected OpCode; a QN of no queue is DDP Invalid QN.
#[test]
fn rdmap_104_queue_checks() {
    let mut send_on_qn1 = SEED_FIG5_ULPDU;
    send_on_qn1[9] = 1;
    let err = Segment::parse(&send_on_qn1).unwrap_err();
    assert_eq!(classify(&err), Some(Violation::QueueMismatch));
    assert_eq!(
        terminate_code_for(&err),
        Some(TerminateCode::RdmaRemoteOperation(
            RemoteOperationError::UnexpectedOpcode
        ))
    );
    let mut rr_on_qn0 = SIW_READ_BW_READ_REQUEST;
    rr_on_qn0[9] = 0;
    assert_eq!(
        classify(&Segment::parse(&rr_on_qn0).unwrap_err()),
        Some(Violation::QueueMismatch)
    );

    let mut send_on_qn7 = SEED_FIG5_ULPDU;
    send_on_qn7[9] = 7;
    let err = Segment::parse(&send_on_qn7).unwrap_err();
    assert_eq!(
        err,
        Error::Unknown {
            layer: Layer::Ddp,
            field: FIELD_QN,
            value: 7
        }
    );
    assert_eq!(classify(&err), Some(Violation::UndefinedQueue));
    assert_eq!(
        terminate_code_for(&err),
        Some(TerminateCode::Ddp(DdpError::UntaggedBuffer(
            ddp::UntaggedBufferError::InvalidQn
        )))
    );
    let seg = Segment::new(
        untagged(Opcode::Send, 2, 1, 0, true),
        Body::Send { payload: &[] },
    );
    assert_eq!(
        seg.emit(&mut [0; 64]),
        Err(Violation::QueueMismatch.error())
    );
    // Truncation is not a violation.
    assert_eq!(
        terminate_code_for(&Segment::parse(&[0x41]).unwrap_err()),
        None
    );
}

/// Header-carrying messages are one DDP segment at MO 0.
#[test]
fn header_messages_are_single_segments() {
    let mut not_last = SIW_READ_BW_READ_REQUEST;
    not_last[0] = 0x01;
    let mut mo4 = SIW_BAD_WRITE_TERMINATE;
    mo4[17] = 4;
    for bytes in [&not_last[..], &mo4[..]] {
        let err = Segment::parse(bytes).unwrap_err();
        assert_eq!(classify(&err), Some(Violation::NotSingleSegment));
        assert_eq!(
            terminate_code_for(&err),
            Some(TerminateCode::RdmaRemoteOperation(
                RemoteOperationError::Unspecified
            ))
        );
    }
    // A control opcode that differs from the body is refused on emit.
    let seg = Segment {
        control: Control::new(Opcode::SendWithSe),
        ..Segment::new(
            untagged(Opcode::Send, 0, 1, 0, true),
            Body::Send { payload: &[] },
        )
    };
    assert!(matches!(
        seg.emit(&mut [0; 64]),
        Err(Error::Malformed { .. })
    ));
}

/// siw-rping.pcap frame 11: a Send, deconstructed with getters and re-emitted.
#[test]
fn siw_rping_send_capture() {
    let h = ddp::Header::new_checked(&SIW_RPING_SEND[..]).unwrap();
    assert!(!h.tagged() && h.last());
    assert_eq!(h.dv(), 1);
    assert_eq!((h.qn(), h.msn(), h.mo()), (Some(0), Some(1), Some(0)));
    assert_eq!(
        Control::parse(h.rsvd_ulp()).unwrap(),
        Control::new(Opcode::Send)
    );
    // rping's payload: buffer address, rkey, length.
    assert_eq!(
        h.payload(),
        &[
            0x00, 0x00, 0x56, 0x39, 0x90, 0xb5, 0x03, 0x70, 0x51, 0xa1, 0x6c, 0x00, 0x00, 0x00,
            0x00, 0x40
        ]
    );
    let seg = round_trip(&SIW_RPING_SEND);
    assert_eq!(seg.body.payload(), Some(h.payload()));
}

/// siw-send_inv.pcap frame 11 (RDMAP-15, RDMAP-66): Send with Invalidate;
/// rdmazoo asked to invalidate STag 0 (siw then fails the receive).
#[test]
fn siw_send_inv_capture() {
    let h = ddp::Header::new_checked(&SIW_SEND_INV[..]).unwrap();
    assert_eq!(h.rsvd_ulp(), &[0x44, 0, 0, 0, 0]);
    assert_eq!((h.qn(), h.msn(), h.mo()), (Some(0), Some(1), Some(0)));
    let seg = round_trip(&SIW_SEND_INV);
    assert_eq!(seg.opcode(), Opcode::SendWithInvalidate);
    assert_eq!(
        seg.body,
        Body::SendWithInvalidate {
            invalidate_stag: 0,
            payload: &[b'a'; 64]
        }
    );
}

/// siw-ib_read_bw.pcap frame 61 (RDMAP-24, RDMAP-51, EXT-DDP-03): the last
/// Read Response segment targets the request's SinkSTag at SinkTO + 2856.
#[test]
fn siw_ib_read_bw_read_response_capture() {
    let bytes = hex(SIW_READ_BW_READ_RESPONSE_LAST);
    assert_eq!(bytes.len(), 1254);
    let h = ddp::Header::new_checked(&bytes[..]).unwrap();
    assert!(h.tagged() && h.last());
    assert_eq!(h.rsvd_ulp(), &[0x42]);
    let request = ReadRequestRepr::parse(&SIW_READ_BW_READ_REQUEST[18..]).unwrap();
    assert_eq!(h.stag(), Some(request.sink_stag));
    assert_eq!(h.to(), Some(request.sink_to + 2 * 1428));
    let seg = round_trip(&bytes);
    assert_eq!(seg.opcode(), Opcode::RdmaReadResponse);
    assert_eq!(seg.body.payload().map(<[u8]>::len), Some(1240));
}

/// siw-ib_write_bw.pcap frame 44 (RDMAP-35): last segment of an RDMA Write.
#[test]
fn siw_ib_write_bw_write_capture() {
    let bytes = hex(SIW_WRITE_BW_WRITE_LAST);
    let h = ddp::Header::new_checked(&bytes[..]).unwrap();
    assert!(h.tagged() && h.last());
    assert_eq!(h.stag(), Some(0x0a78_6c00));
    assert_eq!(h.to(), Some(0x0000_55b3_17ba_ab28));
    let seg = round_trip(&bytes);
    assert_eq!(
        seg.ddp,
        tagged(Opcode::RdmaWrite, 0x0a78_6c00, 0x0000_55b3_17ba_ab28, true)
    );
    assert_eq!(seg.body.payload(), Some(&bytes[14..]));
}

/// siw-ib_send_bw.pcap frame 45 (EXT-DDP-02, RDMAP-58): last segment of a
/// three-segment Send: MSN 1, MO 2848, L=1.
#[test]
fn siw_ib_send_bw_multi_segment_send_capture() {
    let bytes = hex(SIW_SEND_BW_SEND_LAST);
    assert_eq!(bytes.len(), 1266);
    let seg = round_trip(&bytes);
    assert_eq!(seg.ddp, untagged(Opcode::Send, 0, 1, 2848, true));
    assert_eq!(seg.body.payload().map(<[u8]>::len), Some(4096 - 2848));
}

/// Every truncation of every real ULPDU is an error or a shorter valid
/// segment, never a panic; below the headers it is always an error.
#[test]
fn truncated_captures_never_panic() {
    let vectors: [&[u8]; 7] = [
        &SIW_RPING_SEND,
        &SIW_SEND_INV,
        &SIW_READ_BW_READ_REQUEST,
        &SIW_BAD_READ_REQUEST,
        &SIW_BAD_READ_TERMINATE,
        &SIW_BAD_WRITE_WRITE,
        &SIW_BAD_WRITE_TERMINATE,
    ];
    for v in vectors {
        let hl = ddp::header_len_for(v[0]);
        for len in 0..v.len() {
            let r = Segment::parse(&v[..len]);
            if len < hl {
                assert!(matches!(r, Err(Error::Truncated { .. })));
            }
            if let Ok(seg) = r {
                assert_eq!(emit_vec(&seg), &v[..len]);
            }
        }
    }
}

// ---- proptest strategies

/// An owned body, so that a strategy can produce it.
#[derive(Debug, Clone)]
enum BodySpec {
    Payload(Opcode, Vec<u8>, u32),
    ReadRequest(ReadRequestRepr),
    Terminate(TerminateRepr),
    Immediate(bool, ImmediateDataRepr),
    AtomicRequest(AtomicRequestRepr),
    AtomicResponse(AtomicResponseRepr),
}

impl BodySpec {
    fn body(&self) -> Body<'_> {
        match self {
            BodySpec::Payload(op, p, stag) => {
                let (payload, invalidate_stag) = (&p[..], *stag);
                match op {
                    Opcode::RdmaWrite => Body::RdmaWrite { payload },
                    Opcode::RdmaReadResponse => Body::RdmaReadResponse { payload },
                    Opcode::Send => Body::Send { payload },
                    Opcode::SendWithSe => Body::SendWithSe { payload },
                    Opcode::SendWithInvalidate => Body::SendWithInvalidate {
                        invalidate_stag,
                        payload,
                    },
                    _ => Body::SendWithSeAndInvalidate {
                        invalidate_stag,
                        payload,
                    },
                }
            }
            BodySpec::ReadRequest(r) => Body::RdmaReadRequest(*r),
            BodySpec::Terminate(t) => Body::Terminate(*t),
            BodySpec::Immediate(false, i) => Body::ImmediateData(*i),
            BodySpec::Immediate(true, i) => Body::ImmediateDataWithSe(*i),
            BodySpec::AtomicRequest(a) => Body::AtomicRequest(*a),
            BodySpec::AtomicResponse(a) => Body::AtomicResponse(*a),
        }
    }
}

fn arb_body_spec() -> impl Strategy<Value = BodySpec> {
    let payload_ops = proptest::sample::select(vec![
        Opcode::RdmaWrite,
        Opcode::RdmaReadResponse,
        Opcode::Send,
        Opcode::SendWithSe,
        Opcode::SendWithInvalidate,
        Opcode::SendWithSeAndInvalidate,
    ]);
    prop_oneof![
        (
            payload_ops,
            proptest::collection::vec(any::<u8>(), 0..64),
            any::<u32>()
        )
            .prop_map(|(op, p, stag)| BodySpec::Payload(op, p, stag)),
        arb_read_request().prop_map(BodySpec::ReadRequest),
        arb_terminate().prop_map(|mut t| {
            // siw sends no reserved bits; see prop_terminate_round_trip.
            if t.layout == TerminateLayout::LinuxSiw {
                t.reserved = 0;
            }
            BodySpec::Terminate(t)
        }),
        (any::<bool>(), arb_immediate()).prop_map(|(se, i)| BodySpec::Immediate(se, i)),
        arb_atomic_request().prop_map(BodySpec::AtomicRequest),
        arb_atomic_response().prop_map(BodySpec::AtomicResponse),
    ]
}

/// The DDP and control fields of a segment, shaped to the opcode later.
#[derive(Debug, Clone)]
struct Frame {
    last: bool,
    reserved: u8,
    dv: u8,
    rsvd_tail: [u8; 4],
    stag: u32,
    to: u64,
    msn: u32,
    mo: u32,
    rv: u8,
    rsv: u8,
}

fn arb_frame() -> impl Strategy<Value = Frame> {
    (
        any::<bool>(),
        0u8..16,
        0u8..4,
        any::<[u8; 4]>(),
        any::<u32>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        0u8..4,
        0u8..4,
    )
        .prop_map(
            |(last, reserved, dv, rsvd_tail, stag, to, msn, mo, rv, rsv)| Frame {
                last,
                reserved,
                dv,
                rsvd_tail,
                stag,
                to,
                msn,
                mo,
                rv,
                rsv,
            },
        )
}

/// A segment `parse` accepts: T, QN and segmentation follow the opcode.
fn segment<'a>(f: &Frame, spec: &'a BodySpec) -> Segment<'a> {
    let body = spec.body();
    let op = body.opcode();
    let control = Control {
        rv: f.rv,
        rsv: f.rsv,
        opcode: op,
    };
    let octet = control.octet().unwrap();
    let ddp = match op.queue() {
        None => ddp::Repr::Tagged {
            last: f.last,
            reserved: f.reserved,
            dv: f.dv,
            rsvd_ulp: octet,
            stag: f.stag,
            to: f.to,
        },
        Some(q) => {
            let single = op.has_rdmap_header();
            // emit writes the Invalidate STag over RsvdULP octets 1..5.
            let t = match body.invalidate_stag() {
                Some(stag) => stag.to_be_bytes(),
                None => f.rsvd_tail,
            };
            ddp::Repr::Untagged {
                last: f.last || single,
                reserved: f.reserved,
                dv: f.dv,
                rsvd_ulp: [octet, t[0], t[1], t[2], t[3]],
                qn: q.into(),
                msn: f.msn,
                mo: if single { 0 } else { f.mo },
            }
        }
    };
    Segment { ddp, control, body }
}

proptest! {
    /// Segment: emit -> parse -> emit for every opcode (RDMAP-04, -14..-16).
    #[test]
    fn prop_segment_round_trip(frame in arb_frame(), spec in arb_body_spec()) {
        let seg = segment(&frame, &spec);
        let bytes = emit_vec(&seg);
        let parsed = Segment::parse(&bytes).unwrap();
        prop_assert_eq!(parsed.control, seg.control);
        prop_assert_eq!(parsed.ddp, seg.ddp);
        match (parsed.body, seg.body) {
            (Body::Terminate(a), Body::Terminate(b)) => {
                // The layout may be re-detected; the octets are the same.
                prop_assert_eq!(
                    TerminateRepr::parse_with_layout(&bytes[18..], b.layout),
                    Ok(b)
                );
                prop_assert_eq!(a.buffer_len(), b.buffer_len());
            }
            (a, b) => prop_assert_eq!(a, b),
        }
        prop_assert_eq!(emit_vec(&parsed), bytes);
    }
}
