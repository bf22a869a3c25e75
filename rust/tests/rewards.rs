//! The reward rules on hand-made ground truth: exact answers score 1.0, garbage gets a score
//! and never panics, and the known reward hacks stay low.

use rookworld::reward::{score, GroundTruth, Parts, PolicyReward, ScoreError, Scoring, Shaping, UNPARSEABLE};
use rookworld::{a_text::env_target, policy_target, Layout};

const FEN: &str = "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3";

fn truth() -> GroundTruth {
    GroundTruth {
        moves: ["f1b5", "d2d4", "f1c4", "b1c3", "c2c3"].map(String::from).to_vec(),
        evals: vec![0.45, 0.38, 0.3, 0.21, 0.12],
    }
}

fn p_prompt() -> String {
    format!("P: {FEN}")
}

fn p_reward(completion: &str) -> f64 {
    score(&p_prompt(), completion, Some(&truth()), Shaping::Continuous).unwrap().reward
}

fn exact_p() -> String {
    let a = truth();
    // Shuffled as in the data: E[i] belongs to M[i].
    let order = [2, 0, 4, 1, 3];
    let moves: Vec<String> = order.iter().map(|&i| a.moves[i].clone()).collect();
    let evals: Vec<f64> = order.iter().map(|&i| a.evals[i]).collect();
    policy_target(FEN, &moves, &evals, &a.moves[0], Layout::RookWorld)
}

#[test]
fn exact_policy_answer_scores_one_in_both_shapings() {
    for shaping in [Shaping::Continuous, Shaping::Graduated] {
        let s = score(&p_prompt(), &exact_p(), Some(&truth()), shaping).unwrap();
        assert_eq!(s.reward, 1.0, "{shaping:?}");
        let Some(Parts::Policy(parts)) = s.parts else { panic!() };
        assert_eq!((parts.best_rank, parts.hits), (1, 5));
    }
}

#[test]
fn policy_quality_orders_answers() {
    let second_best = exact_p().replace("B: f1b5", "B: d2d4");
    let outside_top = exact_p().replace("B: f1b5", "B: a2a3");
    let illegal = exact_p().replace("B: f1b5", "B: e1g1");
    let (r1, r2, r3, r4) = (p_reward(&exact_p()), p_reward(&second_best), p_reward(&outside_top), p_reward(&illegal));
    assert!(r1 > r2 && r2 > r3 && r3 > r4, "{r1} {r2} {r3} {r4}");
    assert!(r4 >= 0.2);
}

#[test]
fn policy_hacks_stay_low() {
    let same_move_five_times = "M: f1b5 f1b5 f1b5 f1b5 f1b5 E: 0.45 0.45 0.45 0.45 0.45 B: f1b5";
    let right_best_nonsense_rest = "M: zzzz e9e9 a1a1 0000 xx E: 7 7 7 7 7 B: f1b5";
    let ten_moves = "M: f1b5 d2d4 f1c4 b1c3 c2c3 a2a3 h2h3 g2g3 b2b3 a2a4 E: 0.45 0.38 0.3 0.21 0.12 B: f1b5";
    let hacks = [
        ("same move five times", p_reward(same_move_five_times)),
        ("right B: with nonsense M:/E:", p_reward(right_best_nonsense_rest)),
        ("ten candidates", p_reward(ten_moves)),
    ];
    for (name, r) in hacks {
        assert!(r < 0.9, "{name}: {r}");
    }
    assert!(hacks[0].1 < 0.75, "{hacks:?}");
    assert!(hacks[1].1 <= 0.4 + 1e-12, "{hacks:?}");
}

#[test]
fn all_zero_evals_lose_the_eval_credit_where_the_position_is_not_level() {
    // White is clearly better: writing 0.0 for every move must forfeit the E: component.
    let winning = GroundTruth { moves: truth().moves, evals: vec![3.1, 2.9, 2.5, 2.2, 1.8] };
    let exact = policy_target(FEN, &winning.moves, &winning.evals, "f1b5", Layout::RookWorld);
    let zeros = policy_target(FEN, &winning.moves, &[0.0; 5], "f1b5", Layout::Compact);
    let r = |c: &str| score(&p_prompt(), c, Some(&winning), Shaping::Continuous).unwrap().reward;
    assert_eq!(r(&exact), 1.0);
    assert!(r(&zeros) < 1.0 - 0.8 * rookworld::reward::W_EVALS * 0.95, "{}", r(&zeros));
}

#[test]
fn garbage_gets_a_score_without_panicking() {
    let huge = "M: ".repeat(100_000) + &"é".repeat(100_000);
    let junk = [
        "",
        " ",
        "B:",
        "M: E: B:",
        "M: e2e4 E: 1.0",
        "\u{0}\u{1}\u{ffff}",
        "M: 🐴 E: 🐴 B: 🐴",
        huge.as_str(),
        "M: e2e4 E: 1e999999 B: e2e4",
        "M: e2e4 E: -nan B: e2e4",
    ];
    for text in junk {
        for shaping in [Shaping::Continuous, Shaping::Graduated] {
            let s = score(&p_prompt(), text, Some(&truth()), shaping).unwrap();
            assert!((UNPARSEABLE..=1.0).contains(&s.reward), "{text:?}: {s:?}");
        }
    }
    // Truncated answers, at every cut point.
    let exact = exact_p();
    for cut in (0..exact.len()).filter(|i| exact.is_char_boundary(*i)) {
        let r = p_reward(&exact[..cut]);
        assert!((UNPARSEABLE..1.0).contains(&r), "cut {cut}: {r}");
    }
    assert_eq!(p_reward(""), UNPARSEABLE);
    assert!(p_reward("M: a2a3 E: 0.0 B: a2a3") >= 0.2, "well formed scores at least 0.2");
}

const A_PROMPT: &str =
    "A: 8/2k2b2/R1p4r/3p1p2/P7/2P2B1P/5PPK/4R3 w - - 1 31+a6a5+f7e7 h5f3 e6f7 b1b6 h8h6 a1e1 e7d8 b6a6 d8c7 a6a5+";

fn a_reward(completion: &str) -> f64 {
    score(A_PROMPT, completion, None, Shaping::Continuous).unwrap().reward
}

#[test]
fn exact_env_answer_scores_one_and_trailing_text_is_ignored() {
    let target = env_target(A_PROMPT).unwrap();
    assert_eq!(a_reward(&target), 1.0);
    assert_eq!(score(A_PROMPT, &target, None, Shaping::Graduated).unwrap().reward, 1.0);
    assert_eq!(a_reward(&format!("{target}\n\nA: more text+x+y+")), 1.0);
    assert_eq!(a_reward(&format!("  {target}  ")), 1.0);
}

#[test]
fn env_near_misses_earn_little() {
    let target = env_target(A_PROMPT).unwrap();
    let copied_prompt_fen = "8/2k2b2/R1p4r/3p1p2/P7/2P2B1P/5PPK/4R3 w - - 1 31+0.001+0+0";
    let one_char_off = target.replacen("R2p1p2", "R2p1p1", 1);
    let wrong_flags = target.replace("+0.001+0+0", "+-1.0+0+1");
    let (copy, near, flags) = (a_reward(copied_prompt_fen), a_reward(&one_char_off), a_reward(&wrong_flags));
    assert!(copy < 0.4, "copying the prompt's FEN: {copy}");
    assert!(near < 0.65 && near > copy, "one character off: {near}");
    assert!(flags < 1.0 && flags > near, "right FEN, wrong reward and flags: {flags}");
    assert_eq!(a_reward("no plus signs at all"), UNPARSEABLE);
    assert_eq!(a_reward("+0.001+0+0"), UNPARSEABLE);
}

#[test]
fn illegal_move_prompt_rewards_copying_the_board() {
    let prompt = "A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e5+e2e5+";
    let target = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+-1.0+0+1";
    assert_eq!(score(prompt, target, None, Shaping::Continuous).unwrap().reward, 1.0);
}

#[test]
fn bad_prompts_and_missing_ground_truth_are_errors() {
    assert!(score("Q: what", "x", None, Shaping::Continuous).is_err());
    assert!(score("P: not a fen", "x", Some(&truth()), Shaping::Continuous).is_err());
    assert_eq!(score(&p_prompt(), "x", None, Shaping::Continuous), Err(ScoreError::MissingGroundTruth));
    assert!(score("A: broken", "x", None, Shaping::Continuous).is_err());
}

#[test]
fn graduated_steps() {
    let g = Shaping::Graduated;
    let steps: Vec<f64> = [0.0, 0.24, 0.25, 0.5, 0.74, 0.75, 0.99, 1.0].iter().map(|q| g.reward(*q)).collect();
    let want = [0.2, 0.2, 0.4, 0.6, 0.6, 0.8, 0.8, 1.0];
    for (got, want) in steps.iter().zip(want) {
        assert!((got - want).abs() < 1e-12, "{steps:?}");
    }
}

// ---------------------------------------------------------------------------------------------------------
// `PolicyReward::CpLoss`: the B: move graded by the pawns it loses, from a ground truth of every legal move.

/// The five moves above and three more, as an analysis of every legal move would rank them; `a2a3` is quiet,
/// `f3g5` drops a knight's worth, `d1h5` hangs the queen past the clamp: a missed mate is worth at most 20.
fn full_truth() -> GroundTruth {
    let mut t = truth();
    t.moves.extend(["a2a3", "f3g5", "f3e5"].map(String::from));
    t.evals.extend([0.05, -2.55, -11.0]);
    t
}

fn cp_loss(completion: &str, truth: &GroundTruth) -> rookworld::reward::Score {
    let scoring = Scoring { shaping: Shaping::Continuous, policy: PolicyReward::CpLoss };
    score(&p_prompt(), completion, Some(truth), scoring).unwrap()
}

fn policy_parts(s: &rookworld::reward::Score) -> rookworld::reward::PolicyParts {
    let Some(Parts::Policy(parts)) = &s.parts else { panic!("{s:?}") };
    parts.clone()
}

#[test]
fn cp_loss_credit_by_hand() {
    // best = 0.05 + 0.95 exp(-loss): computed by hand from the clamped evals.
    let cases = [("f1b5", 0.0, 1.0), ("d2d4", 0.07, 0.05 + 0.95 * (-0.07f64).exp()),
                 ("a2a3", 0.40, 0.05 + 0.95 * (-0.40f64).exp()), ("f3g5", 3.0, 0.05 + 0.95 * (-3.0f64).exp()),
                 ("f3e5", 10.45, 0.05 + 0.95 * (-10.45f64).exp())];
    for (mv, loss, credit) in cases {
        let s = cp_loss(&exact_p().replace("B: f1b5", &format!("B: {mv}")), &full_truth());
        let p = policy_parts(&s);
        assert!((p.best_loss.unwrap() - loss).abs() < 1e-12, "{mv}: {:?}", p.best_loss);
        // A B: move outside the answer's own M: list keeps half its credit, as under the rank reward.
        let own = if ["a2a3", "f3g5", "f3e5"].contains(&mv) { 0.5 } else { 1.0 };
        assert!((p.best - own * credit).abs() < 1e-12, "{mv}: {} vs {}", p.best, own * credit);
        // Candidates and evals are the top five's, as under the rank reward: the extra moves are not hits.
        assert_eq!(p.hits, 5, "{mv}");
        assert!((s.quality - (0.5 * p.best + 0.3 + 0.2)).abs() < 1e-12, "{mv}: {}", s.quality);
        assert_eq!(p.best_rank, if loss == 0.0 { 1 } else if mv == "d2d4" { 2 } else { 0 });
    }
}

#[test]
fn cp_loss_orders_every_legal_move_and_keeps_illegal_below_legal() {
    let reward = |mv: &str| cp_loss(&format!("M: {mv} E: 0.1 B: {mv}"), &full_truth()).reward;
    let order = ["f1b5", "d2d4", "f1c4", "b1c3", "c2c3", "a2a3", "f3g5", "f3e5"].map(reward);
    assert!(order.windows(2).all(|w| w[0] > w[1]), "{order:?}");
    // Illegal, or legal but unknown to the ground truth (not evaluated): the floor or nothing.
    let illegal = reward("e1g1");
    let unlisted = reward("h2h3");
    assert!(illegal < unlisted && unlisted < order[7], "{illegal} {unlisted} {order:?}");
    let p = policy_parts(&cp_loss("M: h2h3 E: 0.1 B: h2h3", &full_truth()));
    assert_eq!((p.best, p.best_loss), (rookworld::reward::LOSS_FLOOR, None));
}

#[test]
fn cp_loss_equals_rank_where_the_best_move_is_found_and_hacks_stay_low() {
    let scoring = |policy| Scoring { shaping: Shaping::Continuous, policy };
    for completion in [exact_p(), "M: f1b5 f1b5 f1b5 f1b5 f1b5 E: 0.45 0.45 0.45 0.45 0.45 B: f1b5".into(),
                       "M: zzzz e9e9 a1a1 0000 xx E: 7 7 7 7 7 B: f1b5".into()] {
        let rank = score(&p_prompt(), &completion, Some(&full_truth()), scoring(PolicyReward::Rank)).unwrap();
        let loss = score(&p_prompt(), &completion, Some(&full_truth()), scoring(PolicyReward::CpLoss)).unwrap();
        assert_eq!(rank.reward, loss.reward, "{completion}");
    }
    assert!(cp_loss("M: f1b5 f1b5 f1b5 f1b5 f1b5 E: 0.45 0.45 0.45 0.45 0.45 B: f1b5", &full_truth()).reward < 0.75);
    // Mate evals (mate in 2 = 999.98 pawns) are clamped: missing a mate for a winning move loses 10 - 3 = 7.
    let mating = GroundTruth { moves: ["f1b5", "d2d4"].map(String::from).to_vec(), evals: vec![999.98, 3.0] };
    let p = policy_parts(&cp_loss("M: f1b5 d2d4 E: 1 1 B: d2d4", &mating));
    assert!((p.best_loss.unwrap() - 7.0).abs() < 1e-12, "{:?}", p.best_loss);
}
