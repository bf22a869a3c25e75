//! Criterion micro-benchmarks of the chess core: A: transitions, FEN parses, generated positions.
//! Run with `cargo bench --bench core`; figures go to BENCHMARKS.md.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;

use rookworld::batch;
use rookworld::{env_target, generate_positions, parse_fen, step, GeneratorConfig};

const BATCH: usize = 10_000;

fn prompts() -> Vec<String> {
    generate_positions(BATCH, 1, 0, &GeneratorConfig::default()).iter().map(|p| p.env_prompt()).collect()
}

fn transitions(c: &mut Criterion) {
    let prompts = prompts();
    let positions = generate_positions(BATCH, 1, 0, &GeneratorConfig::default());
    let fens: Vec<&str> = positions.iter().map(|p| p.fen.as_str()).collect();
    let moves: Vec<&str> = positions.iter().map(|p| p.mv.as_str()).collect();
    let mut g = c.benchmark_group("env");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.bench_function("env_target/1 thread", |b| {
        b.iter(|| prompts.iter().map(|p| env_target(black_box(p)).is_ok() as usize).sum::<usize>())
    });
    g.bench_function("env_targets/batch (rayon)", |b| b.iter(|| batch::env_targets(black_box(&prompts))));
    g.bench_function("step/1 thread (parsed positions)", |b| {
        let parsed: Vec<_> = fens.iter().map(|f| parse_fen(f).unwrap()).collect();
        b.iter(|| parsed.iter().zip(&moves).map(|(p, m)| step(p, black_box(m)).fen.len()).sum::<usize>())
    });
    g.finish();
}

fn fen_parses(c: &mut Criterion) {
    let positions = generate_positions(BATCH, 2, 0, &GeneratorConfig::default());
    let fens: Vec<&str> = positions.iter().map(|p| p.fen.as_str()).collect();
    let mut g = c.benchmark_group("fen");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.bench_function("parse_fen/1 thread", |b| {
        b.iter(|| fens.iter().filter(|f| parse_fen(black_box(f)).is_ok()).count())
    });
    g.bench_function("normalize_fens/batch (rayon)", |b| b.iter(|| batch::normalize_fens(black_box(&fens))));
    g.finish();
}

fn positions(c: &mut Criterion) {
    let cfg = GeneratorConfig::default();
    let mut g = c.benchmark_group("generate");
    let n = 1_000usize;
    g.throughput(Throughput::Elements(n as u64));
    g.bench_with_input(BenchmarkId::new("generate_positions/batch (rayon)", n), &n, |b, &n| {
        b.iter(|| generate_positions(n, black_box(3), 0, &cfg))
    });
    g.bench_with_input(BenchmarkId::new("generate_position/1 thread", n), &n, |b, &n| {
        b.iter(|| (0..n as u64).map(|i| rookworld::generate_position(3, i, &cfg).fen.len()).sum::<usize>())
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(4));
    targets = transitions, fen_parses, positions
}
criterion_main!(benches);
