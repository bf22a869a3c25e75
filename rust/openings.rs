//! Well-known opening lines in UCI, for the opening share of generated positions.
//! `cargo test` plays every line to prove each move legal.

pub const OPENING_LINES: &[&str] = &[
    "e2e4 e7e5 g1f3 b8c6 f1b5 a7a6 b5a4 g8f6 e1g1 f8e7 f1e1 b7b5 a4b3 d7d6 c2c3 e8g8", // Ruy Lopez, Closed
    "e2e4 e7e5 g1f3 b8c6 f1b5 g8f6 e1g1 f6e4 d2d4 e4d6 b5c6 d7c6 d4e5 d6f5",           // Berlin Defence
    "e2e4 e7e5 g1f3 b8c6 f1c4 f8c5 c2c3 g8f6 d2d4 e5d4 c3d4 c5b4",                     // Giuoco Piano
    "e2e4 e7e5 g1f3 b8c6 f1c4 g8f6 f3g5 d7d5 e4d5 c6a5",                               // Two Knights
    "e2e4 e7e5 g1f3 b8c6 d2d4 e5d4 f3d4 g8f6 d4c6 b7c6 e4e5",                          // Scotch
    "e2e4 e7e5 g1f3 g8f6 f3e5 d7d6 e5f3 f6e4 d2d4 d6d5",                               // Petrov
    "e2e4 e7e5 f2f4 e5f4 g1f3 g7g5",                                                   // King's Gambit
    "e2e4 e7e5 b1c3 g8f6 f2f4 d7d5",                                                   // Vienna
    "e2e4 c7c5 g1f3 d7d6 d2d4 c5d4 f3d4 g8f6 b1c3 a7a6 c1e3 e7e5 d4b3 c8e6",           // Sicilian Najdorf
    "e2e4 c7c5 g1f3 d7d6 d2d4 c5d4 f3d4 g8f6 b1c3 g7g6 c1e3 f8g7 f2f3 e8g8",           // Sicilian Dragon
    "e2e4 c7c5 g1f3 b8c6 d2d4 c5d4 f3d4 g8f6 b1c3 e7e5 d4b5 d7d6",                     // Sveshnikov
    "e2e4 c7c5 g1f3 e7e6 d2d4 c5d4 f3d4 a7a6 f1d3",                                    // Sicilian Kan
    "e2e4 c7c5 b1c3 b8c6 g2g3 g7g6 f1g2 f8g7",                                         // Closed Sicilian
    "e2e4 c7c5 c2c3 g8f6 e4e5 f6d5 d2d4 c5d4 g1f3",                                    // Alapin
    "e2e4 e7e6 d2d4 d7d5 b1c3 f8b4 e4e5 c7c5 a2a3 b4c3 b2c3",                          // French Winawer
    "e2e4 e7e6 d2d4 d7d5 e4e5 c7c5 c2c3 b8c6 g1f3 d8b6",                               // French Advance
    "e2e4 c7c6 d2d4 d7d5 b1c3 d5e4 c3e4 c8f5 e4g3 f5g6",                               // Caro-Kann Classical
    "e2e4 c7c6 d2d4 d7d5 e4e5 c8f5 g1f3 e7e6",                                         // Caro-Kann Advance
    "e2e4 d7d5 e4d5 d8d5 b1c3 d5a5 d2d4 g8f6",                                         // Scandinavian
    "e2e4 g8f6 e4e5 f6d5 d2d4 d7d6 g1f3",                                              // Alekhine
    "e2e4 d7d6 d2d4 g8f6 b1c3 g7g6 f2f4 f8g7",                                         // Pirc, Austrian
    "d2d4 d7d5 c2c4 e7e6 b1c3 g8f6 c1g5 f8e7 e2e3 e8g8 g1f3 h7h6",                     // QGD
    "d2d4 d7d5 c2c4 d5c4 g1f3 g8f6 e2e3 e7e6 f1c4 c7c5",                               // QGA
    "d2d4 d7d5 c2c4 c7c6 g1f3 g8f6 b1c3 d5c4 a2a4 c8f5",                               // Slav
    "d2d4 g8f6 c2c4 g7g6 b1c3 f8g7 e2e4 d7d6 g1f3 e8g8 f1e2 e7e5",                     // King's Indian
    "d2d4 g8f6 c2c4 e7e6 b1c3 f8b4 e2e3 e8g8 f1d3 d7d5",                               // Nimzo-Indian
    "d2d4 g8f6 c2c4 e7e6 g1f3 b7b6 g2g3 c8b7 f1g2 f8e7",                               // Queen's Indian
    "d2d4 g8f6 c2c4 g7g6 b1c3 d7d5 c4d5 f6d5 e2e4 d5c3 b2c3 f8g7",                     // Grunfeld
    "d2d4 g8f6 c2c4 c7c5 d4d5 e7e6 b1c3 e6d5 c4d5 d7d6",                               // Modern Benoni
    "d2d4 g8f6 c2c4 c7c5 d4d5 b7b5 c4b5 a7a6",                                         // Benko Gambit
    "d2d4 f7f5 g2g3 g8f6 f1g2 g7g6 g1f3 f8g7",                                         // Dutch, Leningrad
    "d2d4 g8f6 g1f3 e7e6 c1f4 d7d5 e2e3 c7c5",                                         // London
    "d2d4 d7d5 c1f4 g8f6 e2e3 c7c5 c2c3 b8c6",                                         // London vs d5
    "c2c4 e7e5 b1c3 g8f6 g1f3 b8c6 g2g3 d7d5 c4d5 f6d5",                               // English, Four Knights
    "c2c4 c7c5 g1f3 g8f6 b1c3 b8c6 g2g3 g7g6",                                         // Symmetrical English
    "g1f3 d7d5 g2g3 g8f6 f1g2 e7e6 e1g1 f8e7 d2d3 e8g8",                               // Reti / KIA
    "b2b3 e7e5 c1b2 b8c6 e2e3 g8f6",                                                   // Nimzo-Larsen
    "f2f4 d7d5 g1f3 g8f6 e2e3 g7g6",                                                   // Bird
];
