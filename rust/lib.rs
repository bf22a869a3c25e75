//! rookworld's chess core: the rules of chess exactly as the RookWorld data uses them.
//!
//! Plain Rust modules, one concern each. `batch` runs them over whole batches with rayon;
//! `python` (behind the `python` feature) is the thin PyO3 layer that maturin builds.
//! `p_text` and `a_text` are the text formats of the P: (policy) and A: (environment) tasks, named
//! by task so that neither reads as the network, which is Python's `rookworld.net.model`.

pub mod a_text;
pub mod analysis;
pub mod batch;
pub mod env;
pub mod fen;
pub mod generate;
pub mod history;
pub mod mate;
pub mod moves;
pub mod notation;
mod openings;
pub mod p_text;
pub mod perft;
pub mod pgn;
pub mod pgn_positions;
pub mod reward;
pub mod rng;
pub mod similarity;

#[cfg(feature = "python")]
mod python;

pub use analysis::{check_analysis, AnalysisError, MAX_EVAL};
pub use a_text::{env_prompt, env_target, parse_env_prompt, EnvPrompt, PromptError, HISTORY_LEN};
pub use env::{step, GameEnd, Reward, Transition};
pub use fen::{parse_fen, to_fen, FenError};
pub use history::{check_history, HistoryError};
pub use generate::{generate_position, generate_positions, GeneratedPosition, GeneratorConfig, Phase};
pub use mate::{mate_in_one_position, mate_in_one_positions, mating_moves, MateInOne};
pub use moves::{legal_move, legal_uci_moves};
pub use notation::{parse_move, san, MoveError};
pub use p_text::{parse_answer, policy_target, prompt_fen, Layout, PolicyAnswer};
pub use perft::perft;
pub use reward::{score, GroundTruth, PolicyReward, Score, ScoreError, Scoring, Shaping, Task};
