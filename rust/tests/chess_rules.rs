//! Move generation against published perft counts, and the en-passant cases that trip up
//! move generators (https://www.chessprogramming.org/Perft_Results and the TalkChess suite).

use rookworld::{legal_uci_moves, parse_fen, perft, step, Reward};

fn check(fen: &str, expected: &[u64]) {
    let pos = parse_fen(fen).unwrap();
    for (i, want) in expected.iter().enumerate() {
        let depth = i as u32 + 1;
        assert_eq!(perft(&pos, depth), *want, "perft({depth}) of {fen}");
    }
    let last = expected.len() as u32;
    assert_eq!(rookworld::batch::perft(fen, last).unwrap(), expected[expected.len() - 1], "parallel perft");
}

#[test]
fn perft_start_position() {
    check("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", &[20, 400, 8_902, 197_281, 4_865_609]);
}

#[test]
fn perft_kiwipete() {
    check("r3k2r/p1ppqpb1/bn2pnp1/3PN3/1p2P3/2N2Q1p/PPPBBPPP/R3K2R w KQkq - 0 1", &[48, 2_039, 97_862, 4_085_603]);
}

#[test]
fn perft_position_3() {
    check("8/2p5/3p4/KP5r/1R3p1k/8/4P1P1/8 w - - 0 1", &[14, 191, 2_812, 43_238, 674_624]);
}

#[test]
fn perft_position_4() {
    check("r3k2r/Pppp1ppp/1b3nbN/nP6/BBP1P3/q4N2/Pp1P2PP/R2Q1RK1 w kq - 0 1", &[6, 264, 9_467, 422_333]);
    // The same position mirrored, Black to move.
    check("r2q1rk1/pP1p2pp/Q4n2/bbp1p3/Np6/1B3NBn/pPPP1PPP/R3K2R b KQ - 0 1", &[6, 264, 9_467, 422_333]);
}

#[test]
fn perft_position_5() {
    check("rnbq1k1r/pp1Pbppp/2p5/8/2B5/8/PPP1NnPP/RNBQK2R w KQ - 1 8", &[44, 1_486, 62_379, 2_103_487]);
}

#[test]
fn perft_position_6() {
    check(
        "r4rk1/1pp1qppp/p1np1n2/2b1p1B1/2B1P1b1/P1NP1N2/1PP1QPPP/R4RK1 w - - 0 10",
        &[46, 2_079, 89_890, 3_894_594],
    );
}

#[test]
fn perft_en_passant_suite() {
    // Avoid the illegal en-passant capture that would expose the king along the rank.
    let pos = parse_fen("3k4/3p4/8/K1P4r/8/8/8/8 b - - 0 1").unwrap();
    assert_eq!(perft(&pos, 6), 1_134_888);
    let pos = parse_fen("8/8/4k3/8/2p5/8/B2P2K1/8 w - - 0 1").unwrap();
    assert_eq!(perft(&pos, 6), 1_015_133);
    // En passant capture that gives check.
    let pos = parse_fen("8/8/1k6/2b5/2pP4/8/5K2/8 b - d3 0 1").unwrap();
    assert_eq!(perft(&pos, 6), 1_440_467);
}

#[test]
fn pinned_en_passant_pawn_cannot_capture() {
    // e4xd3 would leave the black king on a4 in the queen's line along the fourth rank.
    let pos = parse_fen("8/8/8/8/k2Pp2Q/8/8/3K4 b - d3 0 1").unwrap();
    let moves = legal_uci_moves(&pos);
    assert!(!moves.contains(&"e4d3".to_string()), "{moves:?}");
    assert!(moves.contains(&"e4e3".to_string()));
    assert_eq!(step(&pos, "e4d3").reward, Reward::Illegal);
    // And no en-passant square is printed, since no capture can use it.
    assert_eq!(rookworld::to_fen(&pos), "8/8/8/8/k2Pp2Q/8/8/3K4 b - - 0 1");

    // Pinned on a diagonal: capturing en passant along the pin is legal, leaving it is not.
    let pos = parse_fen("8/5b2/8/3Pp3/8/1K6/8/7k w - e6 0 1").unwrap();
    let moves = legal_uci_moves(&pos);
    assert!(moves.contains(&"d5e6".to_string()), "{moves:?}");
    assert!(!moves.contains(&"d5d6".to_string()), "{moves:?}");
    let pos = parse_fen("8/1b6/8/3Pp3/8/5K2/8/7k w - e6 0 1").unwrap();
    assert!(!legal_uci_moves(&pos).contains(&"d5e6".to_string()));
}

#[test]
fn en_passant_that_evades_check() {
    // d7-d5 gave check to the king on e4; taking en passant removes the checker.
    let pos = parse_fen("8/8/8/3pP3/4K3/8/8/k7 w - d6 0 2").unwrap();
    let moves = legal_uci_moves(&pos);
    assert!(moves.contains(&"e5d6".to_string()), "{moves:?}");
    let t = step(&pos, "e5d6");
    assert_eq!(t.to_string(), "8/8/3P4/8/4K3/8/8/k7 b - - 0 2+0.001+0+0");

    // d7-d5 uncovered a check from the c8 bishop: en passant does not block it, so it is illegal.
    let pos = parse_fen("2b5/8/8/3pP3/6K1/8/8/k7 w - d6 0 2").unwrap();
    assert!(!legal_uci_moves(&pos).contains(&"e5d6".to_string()));
}

