use billing_api::access::{Principal, Role};
use billing_api::cli::{Cli, Command, TenantsCommand, TokenCommand};
use billing_api::params::TenantId;
use billing_api::tenant_admin;
use billing_api::tokens::{self, IssueRequest};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(code) => code,
        Err(e) => {
            // One line that says what is wrong, not a stack trace.
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn run() -> anyhow::Result<std::process::ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli: Cli = serving::retired::parse()?;
    let Some(command) = cli.command else {
        billing_api::service::run(cli.config, serving::shutdown_signal()).await?;
        return Ok(std::process::ExitCode::SUCCESS);
    };
    let pool = schema::connect(
        &cli.config.database_url,
        2,
        std::time::Duration::from_secs(30),
    )
    .await?;
    let cmd = match command {
        Command::Token(cmd) => cmd,
        Command::Tenants(TenantsCommand::Apply { file }) => {
            let seed = tenant_admin::load("tenants apply", &file)?;
            tenant_admin::apply(&pool, &seed).await?;
            tracing::info!(tenants = seed.tenants.len(), file = %file.display(), "applied");
            return Ok(std::process::ExitCode::SUCCESS);
        }
    };
    let who = Principal {
        token_id: "cli".into(),
        role: Role::Finance,
        tenant_id: None,
    };
    let out = match cmd {
        TokenCommand::Issue {
            role,
            tenant,
            label,
        } => {
            let tenant_id = tenant
                .map(|t| TenantId::parse(&t))
                .transpose()
                .map_err(anyhow::Error::msg)?;
            let issued = tokens::issue(
                &pool,
                &who,
                &IssueRequest {
                    role,
                    tenant_id,
                    label,
                },
            )
            .await?;
            serde_json::to_string_pretty(&issued)?
        }
        TokenCommand::List => serde_json::to_string_pretty(&tokens::list(&pool, &who).await?)?,
        TokenCommand::Revoke { token_id } => {
            serde_json::to_string_pretty(&tokens::revoke(&pool, &who, &token_id).await?)?
        }
    };
    #[expect(clippy::print_stdout, reason = "the CLI's answer")]
    {
        println!("{out}");
    }
    Ok(std::process::ExitCode::SUCCESS)
}
