//! Command-line arguments and the subcommands behind them.

mod chat;
mod common;
mod devices;
mod info;
mod perplexity;
mod run;
mod tokenize;

use clap::{Parser, Subcommand};

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
    /// Chat interactively with the model's chat template.
    Chat(chat::ChatArgs),
    /// Perplexity of a text file, as llama.cpp's perplexity tool computes it.
    Perplexity(perplexity::PerplexityArgs),
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
        Command::Chat(a) => chat::run(a),
        Command::Perplexity(a) => perplexity::run(a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::Info(a) => info::run(a),
        Command::Devices(a) => devices::run(a),
    }
}
