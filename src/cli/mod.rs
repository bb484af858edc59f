//! Command-line arguments and the subcommands behind them.

mod common;
mod devices;
mod info;
mod run;
mod tokenize;

use clap::{Parser, Subcommand};

pub use common::{ModelArgs, SamplingArgs};

#[derive(Parser, Debug)]
#[command(
    name = "wgllm",
    version,
    about = "GPU-first LLM inference on wgpu compute shaders"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate text from a prompt.
    Run(run::RunArgs),
    /// Tokenize text and print the ids.
    Tokenize(tokenize::TokenizeArgs),
    /// Print a model's metadata and tensor table.
    Info(info::InfoArgs),
    /// List GPU adapters with their backend, type, driver, features and limits.
    Devices(devices::DevicesArgs),
}

pub fn dispatch(cli: Cli) -> wgllm::Result<()> {
    match cli.command {
        Command::Run(a) => run::run(a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::Info(a) => info::run(a),
        Command::Devices(a) => devices::run(a),
    }
}
